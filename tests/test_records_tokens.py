"""records/tokens.py: the per-token column names are the engine's `TokenRecord` fields
(the writers read a record's value by its column's name), and a CSV row is formatted as
the bmoe_metrics CSV abbench's engine wrote has it."""

from __future__ import annotations

import dataclasses

from abbench.engine.run.result import TokenRecord
from abbench.records import tokens


def test_every_column_names_a_token_record_value() -> None:
    names = {f.name for f in dataclasses.fields(TokenRecord)} | {"cache_hit_pct"}
    columns = {*tokens.CSV_COLUMNS, *tokens.PER_TOKEN_COLUMNS, *tokens.PREFILL_COLUMNS}
    assert columns - names == {tokens.STEPS}  # the run's step count, on every CSV row
    assert set(tokens.CSV_DECIMALS) <= set(tokens.CSV_COLUMNS)


def test_each_column_is_written_once_in_its_order() -> None:
    for columns in (tokens.CSV_COLUMNS, tokens.PER_TOKEN_COLUMNS, tokens.PREFILL_COLUMNS):
        assert len(set(columns)) == len(columns)
    assert tokens.PER_TOKEN_COLUMNS[:len(tokens.MEASURES)] == tokens.MEASURES
    assert (*tokens.MEASURES, tokens.TOKENS) == tokens.PREFILL_COLUMNS


def test_a_csv_row_formats_the_fractional_columns() -> None:
    values = {c: 7 for c in tokens.CSV_COLUMNS} | {
        tokens.WALL_MS: 1.23456, tokens.CACHE_HIT_PCT: 71.428571, tokens.RSS_MIB: 114.3984}
    row = tokens.csv_row(values)
    assert list(row) == list(tokens.CSV_COLUMNS)
    assert (row[tokens.WALL_MS], row[tokens.CACHE_HIT_PCT], row[tokens.RSS_MIB]) == \
        ("1.235", "71.43", "114.4")
    assert row[tokens.READ_BYTES] == 7 and row[tokens.IO_MS] == "7.000"
