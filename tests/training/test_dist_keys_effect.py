"""The two ``dist.*`` keys whose effect is not in a run's numbers: ``dist.reshard_after_forward`` (memory:
which blocks hold whole weights after a forward) and ``dist.timeout`` (how long a collective waits for a
rank that never comes). Each is checked in fresh processes (a process group per process), in seconds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world: int, port: int) -> dict[str, str]:
    return {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}


SHARDED = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from gptforge.config import DistConfig
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.parallel.distributed import DistInfo, gathered, wrap_model

    dist.init_process_group("gloo", rank=0, world_size=1)
    out = {}
    for keep in (True, False):
        torch.manual_seed(0)
        m = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=64))
        info = DistInfo(rank=0, local_rank=0, world=1, device=torch.device("cpu"), fsdp=True)
        m = wrap_model(m, info, False, DistConfig(shard="fsdp", reshard_after_forward=keep))
        x = torch.zeros(1, 4, dtype=torch.long)
        sharded = lambda: [isinstance(b.attn.c_attn.weight, DTensor) for b in m.transformer.h] + [
            isinstance(m.transformer.wte.weight, DTensor)]
        rec = []
        with torch.no_grad():
            m(x)
            rec.append(sharded())
            with gathered(m):
                rec.append(sharded())
                m(x)
                rec.append(sharded())
            rec.append(sharded())
            m(x)
            rec.append(sharded())
        out[str(keep)] = rec
    print(json.dumps(out))
""")


def test_reshard_after_forward_keeps_the_blocks_whole_after_a_forward_and_gathered_restores_it():
    """Under FSDP2 a forward gathers each block's weights; with dist.reshard_after_forward true they go back
    to shards after it (all but the last block, whose weights backward needs at once), with false they stay
    whole (ZeRO-2's memory). ``gathered`` keeps every block whole inside, whatever the key says, and on exit
    puts the key's behaviour back: a forward after it shards (true) or keeps (false) as before."""
    import json

    port = _port()
    proc = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True, timeout=120,
                          env=_env(0, 1, port))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # [block 0, block 1, block 2, the root's embedding] is a DTensor shard: after a forward, inside gathered
    # (before and after a forward), after leaving it, after the next forward
    shard_after = [True, True, False, True]
    whole = [False, False, False, False]
    assert got["True"] == [shard_after, whole, whole, [True] * 4, shard_after]
    assert got["False"] == [whole, whole, whole, [True] * 4, whole]


WAIT = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    from gptforge.config import DistConfig
    from gptforge.parallel.distributed import init_distributed

    info = init_distributed("cpu", DistConfig(timeout=float(sys.argv[1])))
    if info.rank == 1:  # never joins the collective
        time.sleep(120)
    t0 = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(1))
        print("no error")
    except Exception as e:
        print(f"{time.perf_counter() - t0:.2f} {e}")
    sys.stdout.flush()
    os._exit(0)
""")


def test_timeout_is_how_long_a_collective_waits_for_a_missing_rank():
    """dist.timeout 1 and 3: rank 0's all-reduce, with rank 1 never coming, fails after that many seconds
    (gloo says so in milliseconds), not the default 1800."""
    runs = {}
    for timeout in (1, 3):
        port = _port()
        runs[timeout] = [subprocess.Popen([sys.executable, "-c", WAIT, str(timeout)], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=_env(rank, 2, port))
                         for rank in (0, 1)]
    try:
        for timeout, (r0, _) in runs.items():
            out, err = r0.communicate(timeout=90)
            waited, message = out.strip().split(" ", 1) if out.strip() else ("nan", err[-2000:])
            assert f"{timeout * 1000}ms" in message, message
            # gloo's message names the timeout it was given (the setting's effect, exactly); the wait measured
            # around it is the setting's, not the default 1800 s: at least (nearly) the timeout, and at most the
            # timeout plus what a loaded 2-core machine may hold rank 0 (four processes of this test, the xdist
            # workers): 20 s, far below the default and the communicate's 90 s
            assert timeout * 0.9 <= float(waited) < timeout + 20, (timeout, waited)
    finally:
        for procs in runs.values():
            for p in procs:
                p.kill()
                p.wait()
