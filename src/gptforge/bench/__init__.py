"""Benchmarks are programs, not timed tests: they warm up, synchronize, repeat and write JSON.

    gptforge bench --preset tiny --json bench.json                 # training: bench.train
    gptforge bench-generate --size gpt2 --json gen.json            # decoding: bench.generate
    gptforge bench-prepare --json prep.json                        # data preparation: bench.prepare
    gptforge eval --random d2 --tasks hellaswag --bench            # scoring: bench.eval

All of them time through :mod:`gptforge.bench.timing`.
"""
