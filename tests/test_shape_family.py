"""calibration.fit.shape_family: one label per row, by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.fit import shape_family


def test_labels_join_integer_columns_row_by_row() -> None:
    heads = pd.Series([32.0, 8.0, 32.0], index=[5, 7, 9])  # float columns of integers
    kv = pd.Series([8, 8, 8], index=[5, 7, 9])
    dim = pd.Series([128, 64, 128], index=[5, 7, 9])
    got = shape_family(heads, kv, dim)
    assert got.dtype == object and all(type(x) is str for x in got)
    assert got.tolist() == ["32/8/128", "8/8/64", "32/8/128"]
    # one column: its integers as text; the labels keep the rows' order
    assert shape_family(pd.Series([4096.0, 1.0])).tolist() == ["4096", "1"]
    assert pd.unique(pd.Series(got)).tolist() == ["32/8/128", "8/8/64"]


def test_labels_are_the_rows_joined_one_by_one() -> None:
    rng = np.random.default_rng(7)
    cols = [pd.Series(rng.integers(1, 70_000, 5000)), pd.Series(rng.integers(1, 9, 5000) * 1.0),
            pd.Series(rng.integers(1, 512, 5000))]  # fmt: skip
    want = ["/".join(str(int(c.iloc[i])) for c in cols) for i in range(5000)]
    assert shape_family(*cols).tolist() == want
