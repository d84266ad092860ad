"""benchmarks/common.py: the shared plain-text table."""

from benchmarks.common import format_table


def test_format_table_aligns_header_and_cells_by_spec():
    lines = format_table(["name", "ms", "n"], [("adam", 1.23456, 7), ("hadam", "-", 12)], ["<6", ">7.2f", "3d"], "  ")
    assert lines == ["  name        ms   n", "  adam      1.23   7", "  hadam        -  12"]


def test_format_table_rule_underlines_the_header():
    assert format_table(["a", "b"], [(1, 2)], [">3d", ">3d"], rule=True) == ["  a   b", "-------", "  1   2"]


def test_format_table_passes_note_rows_through_and_takes_short_rows():
    lines = format_table(["a", "b", "note"], [(1,), "  a note", (2, 3, "x")], [">2d", ">2d", ""])
    assert lines == [" a  b note", " 1", "  a note", " 2  3 x"]
