"""bench/bench_length_buckets.py: the long sources it joins are longer than any training source
and fit the model, made of consecutive sentences, each used once."""

from bench.bench_length_buckets import joined_groups


def test_joined_runs_pass_the_longest_training_source_and_fit_the_limit() -> None:
    lengths = [5, 9, 3, 30, 2, 7, 7, 1, 12, 50, 4]
    groups = joined_groups(lengths, longer_than=12, limit=40)
    assert groups == [[0, 1], [2, 3], [4, 5, 6], [7, 8]]  # [10]: 4 pieces, no run of 13
    for run in groups:
        total = sum(lengths[i] for i in run)
        assert 12 < total <= 40
        assert run == list(range(run[0], run[-1] + 1))  # consecutive
    flat = [i for run in groups for i in run]
    assert len(flat) == len(set(flat))
    assert 9 not in flat  # 50 pieces: beyond the limit alone
