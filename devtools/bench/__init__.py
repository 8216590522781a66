"""Benchmarks: rewheel's own steps against the floor each one could reach (`make bench`).

A vLLM virtualenv is about 200 distributions, 57,000 files and 8 GB (torch 1.1 GB, the
nvidia libraries 3.1 GB, vllm 0.8 GB). This package builds such an environment — a
synthetic one from generated wheels with that file-count and file-size profile (scaled by
`BENCH_SCALE`), or a real vLLM release (`BENCH_REAL=1`) — caches it under `.bench/`, and
times, in one run, each rewheel step against its baseline:

  snapshot  vs `cp -al` (one hard link per file: the physical floor) and `cp -a` (a copy)
  patches   vs a bare lstat walk, and vs hashing every file
  diff      (snapshot vs live, after upgrading a few large distributions) vs `cp -al`
  rollback  (byte-exact, offline, durable) vs `uv pip sync` of the old set from a warm uv
            cache, followed by sync(2) so both are durable (the unsynced time is shown too)
  why       on a generated log vs `grep -c Traceback`, with its peak memory

Timings are medians over `BENCH_REPS` repetitions, taken with a warm page cache (every
timed step starts after `sync`, so nobody pays for the previous step's dirty pages).
`cp -a` (a full copy) runs once. The table and `.bench/results.json` carry each ratio, its
target and pass/fail; the exit status is 1 when a target is missed.

Modules this measures that are not in the tree (yet) make their row "not available".
"""

from devtools.bench.harness import BenchConfig, Row, main, run_bench  # noqa: F401
