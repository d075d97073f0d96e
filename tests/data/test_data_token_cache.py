"""Token ids of a cached split, read where they lie in their Arrow chunks."""

import pyarrow as pa

from transformer.data.token_cache import TokenIds


def test_token_ids_index_rows_across_chunks_as_one_list_would():
    """Chunks of several sizes, an empty one and a slice (whose offsets do not start at 0): every
    row and length as in the concatenated column."""
    ids = pa.list_(pa.int32())
    rows = [[5, 6], [], [7], [8, 9, 10], [11], [12, 13], [14]]
    sliced = pa.array([[99], *rows[3:6], [98]], ids).slice(1, 3)  # rows 3-5
    column = pa.chunked_array(
        [pa.array(rows[:2], ids), pa.array([], ids), pa.array(rows[2:3], ids), sliced,
         pa.array(rows[6:], ids)],
        ids,
    )  # fmt: skip
    assert column.to_pylist() == rows
    got = TokenIds(column)
    assert [got[i].tolist() for i in range(len(rows))] == rows
    assert got.lens.tolist() == [len(r) for r in rows]
