#!/usr/bin/env python3
"""Multi-rank tests under a real MPI launch (ctest Mpi.<mode>.np<N>).

Runs `mpirun --oversubscribe -np N` (shared-memory and self transports only: one host; as root
with --allow-run-as-root) on tests/mpi_test_collective.cpp's executable or on trainmem, and
checks exit codes, messages and that nothing hangs (every run has a wall-clock bound):
  collectives  every collective's results on every rank (the executable checks them) -> exit 0
  failure      one rank throws an InputError while the others wait in a collective -> the job
               exits 2 with that rank's message, within a bound; every rank failing alike ->
               exit 2, the message once, no MPI_Abort
  timeout      one rank never joins -> the others' all_reduce_sum times out naming itself and
               the rank; the job ends (non-zero) within a bound
  sharded      the measured sharded step (tests/mpi_test_sharded.cpp): ZeRO 0-3 against each
               other and the single-rank run, ledgers against the trace -> exit 0
  cli          trainmem profile --backend cpu --world-size N --zero 2 under mpirun -> exit 0,
               rank 0's JSON report of every rank (measured == trace == analytic), losses equal
               to the single-rank run of the global batch, one timeline per rank; --tp 2 --sp
               --checkpointing layers:1 -> measured, the same losses; --pp 2 --microbatches 3
               --checkpointing selective -> measured, the same losses; --offload optimizer+params --offload-activations -> every rank's host bytes the analytic's, the same losses;
               --cp 2 --zero 1 --checkpointing full and --cp N (ring attention) -> measured,
               every rank matching, the losses of one rank holding the whole sequence;
               --backend cuda --pp 2 -> measured where every rank has a GPU, else exit 2 naming the device
               or NCCL, once; --world-size not equal to the MPI size ->
               exit 2 saying what to run instead; compare --world-size N: a row per rank,
               checkpointing none and full, each matching; (np 2) --device-budget between the
               two stages' peaks -> stage 0 out of memory, exit 3 with its message and its
               partial report (--output with its rank in the name); --weights and --tokens (the
               golden tiny GQA files) under tp 2 and pp 2 -> the single-rank run's losses, a
               token file short of the global batch -> exit 2 once; a bad flag
               of a measured command -> said once; of estimate -> by each rank that met it, at once;
               ranks started with different flags (MPMD `A : B`: --seed, --model, --batch, --zero,
               --steps) -> exit 2 naming the flag, its values and ranks, once; a
               --collective-timeout below 1 s -> exit 2
  staged       the MPI collectives through host copies (make_staged_collective, the cuda
               backend's --collectives mpi), copies standing in for the device's -> exit 0
  nccl         the collectives on the NCCL backend (CUDA builds; skipped without devices)
  sharded_staged  the same with the collectives through host copies (--collectives mpi) -> exit 0
  sharded_nccl the measured sharded step on cuda with NCCL (CUDA builds; skipped without devices)
  sharded_cuda_mpi  on cuda with --collectives mpi, ranks sharing GPUs (CUDA builds; skipped
               without a device)
Usage: mpi_test.py --mode MODE --np N --mpi-built TRUE|FALSE --test-exe EXE [--sharded-exe EXE]
                  --trainmem BIN
Exits 77 (ctest SKIP_RETURN_CODE) with the reason when MPI or mpirun is absent.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
BOUND_S = 90  # a run that takes longer hangs


def mpirun_cmd(np):
    cmd = ["mpirun", "--oversubscribe", "-np", str(np), "--mca", "btl", "self,vader",
           "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def run(np, args, bound=BOUND_S, threads=None):
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    # Launched from a plain shell, not from inside another MPI job.
    for k in list(env):
        if k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_")):
            del env[k]
    # Sanitizer builds (tools/test.sh --sanitize): OpenMPI's MPI_Finalize leaves allocations,
    # some in MCA components it has already unloaded, that LeakSanitizer reports and cannot
    # attribute (so no suppression file matches them). Leak checking is off for the ranks;
    # ASan's and UBSan's other checks stay on.
    env["ASAN_OPTIONS"] = ":".join(x for x in [env.get("ASAN_OPTIONS", ""), "detect_leaks=0"] if x)
    start = time.monotonic()
    try:
        p = subprocess.run(mpirun_cmd(np) + args, capture_output=True, text=True, timeout=bound,
                           env=env)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        print(f"HANG: {' '.join(args)} did not end within {bound} s\n{out}\n{err}")
        sys.exit(1)
    elapsed = time.monotonic() - start
    print(f"$ {' '.join(mpirun_cmd(np) + args)}\n  exit {p.returncode} after {elapsed:.1f} s")
    return p.returncode, p.stdout, p.stderr, elapsed


def run_mpmd(spec, bound=BOUND_S):
    """mpirun's MPMD form: `spec` is ["-np", "1", prog, args..., ":", "-np", "1", prog, ...]."""
    base = mpirun_cmd(0)
    k = base.index("-np")
    prefix = base[:k] + base[k + 2:]
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_")):
            del env[key]
    env["ASAN_OPTIONS"] = ":".join(x for x in [env.get("ASAN_OPTIONS", ""), "detect_leaks=0"] if x)
    env["OMP_NUM_THREADS"] = "1"
    start = time.monotonic()
    try:
        p = subprocess.run(prefix + spec, capture_output=True, text=True, timeout=bound, env=env)
    except subprocess.TimeoutExpired:
        print(f"HANG: {' '.join(spec)} did not end within {bound} s")
        sys.exit(1)
    elapsed = time.monotonic() - start
    print(f"$ {' '.join(prefix + spec)}\n  exit {p.returncode} after {elapsed:.1f} s")
    return p.returncode, p.stdout, p.stderr, elapsed


def expect_single_losses(exe, doc, rows, what, out, extra=(), model="tiny"):
    """The measured job's losses equal the single-rank run of the same `rows` global rows."""
    rc1, out1, err1 = single(exe, ["profile", "--model", model, "--batch", str(rows), "--seq",
                                   "16", "--backend", "cpu", "--dtype", "fp32", "--format", "json"]
                             + list(extra))
    expect(rc1 == 0, f"the single-rank run of {rows} rows: exit {rc1}", out1, err1)
    if rc1 == 0:
        want = json.loads(out1)["run"]["losses"]
        got = doc.get("losses", [])
        expect(len(got) == len(want) == 2 and
               all(abs(g - w) <= 1e-5 * abs(w) for g, w in zip(got, want)),
               f"{what}: losses {got} equal the single rank's {want} within 1e-5", out)


def expect_routing_reproduced(exe, doc, spec, routes, what, out):
    """The meta trace given a measured run's dumped routing (`spec`: the run's flags on meta)
    equals every measured rank's books byte for byte."""
    rc, out2, err2 = single(exe, spec + ["--routing", routes])
    expect(rc == 0, f"{what}: meta given the measured routing: exit {rc}", out2, err2)
    if rc != 0:
        return
    given = json.loads(out2)
    expect(given.get("all_ranks_match") is True,
           f"{what}: given the routing, the model states match the analytic", out2)
    traced = {r: g["ledger"] for g in given["given_routing"]["ranks"] for r in g["ranks"]}
    keys = ("params", "gradients", "optimizer_states", "activations", "activations_peak",
            "workspace", "peak")
    for m in doc["measured_ranks"]:
        t = traced.get(m["rank"], {})
        expect(all(m["ledger"].get(k) == t.get(k) for k in keys),
               f"{what}: rank {m['rank']}'s measured books equal the meta trace given the "
               f"dumped routing ({m['ledger']} vs {t})", out)


def single(exe, args):
    """One process, not under a launcher."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
    p = subprocess.run([exe] + args, capture_output=True, text=True, timeout=BOUND_S, env=env)
    return p.returncode, p.stdout, p.stderr


problems = []


def expect(cond, what, out="", err=""):
    if not cond:
        problems.append(what)
        print(f"FAIL: {what}\n--- stdout\n{out}\n--- stderr\n{err}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True)
    ap.add_argument("--np", type=int, required=True)
    ap.add_argument("--mpi-built", default="FALSE")
    ap.add_argument("--test-exe", required=True)
    ap.add_argument("--sharded-exe", default="")
    ap.add_argument("--trainmem", required=True)
    a = ap.parse_args()
    n = a.np
    if a.mpi_built.upper() not in ("TRUE", "ON", "1", "YES"):
        print("SKIP: this build has no MPI (libopenmpi-dev was not found at configure time; "
              "tools/setup.sh installs it)")
        return SKIP
    if not shutil.which("mpirun"):
        print("SKIP: mpirun not found (tools/setup.sh installs openmpi-bin)")
        return SKIP

    if a.mode in ("collectives", "staged", "nccl"):
        args = [a.test_exe, "collectives"] + (["--backend", a.mode] if a.mode != "collectives"
                                              else [])
        rc, out, err, _ = run(n, args, bound=240)
        if rc == SKIP and "SKIP:" in out:
            print(out.strip())
            return SKIP
        expect(rc == 0, f"collectives on {n} ranks: exit {rc}", out, err)
        expect(out.count("checks passed") == n,
               f"{n} ranks should each report their checks passed", out, err)
        print(out.strip())

    elif a.mode in ("sharded", "sharded_staged", "sharded_nccl", "sharded_cuda_mpi"):
        # One OpenMP thread per rank: N ranks share the machine's cores.
        extra = {"sharded": [], "sharded_staged": ["--collectives", "mpi"],
                 "sharded_nccl": ["--backend", "cuda"],
                 "sharded_cuda_mpi": ["--backend", "cuda", "--collectives", "mpi"]}[a.mode]
        rc, out, err, _ = run(n, [a.sharded_exe] + extra, bound=600, threads=1)
        if rc == SKIP and "SKIP:" in out:
            print(out.strip())
            return SKIP
        expect(rc == 0, f"the sharded step on {n} ranks: exit {rc}", out, err)
        expect("ok: every check passed on every rank" in out, "rank 0's verdict", out, err)
        print(out.strip())

    elif a.mode == "failure":
        rc, out, err, took = run(n, [a.test_exe, "fail-one"])
        expect(rc == 2, f"one rank failing with an InputError: job exit {rc}, expected 2", out, err)
        expect(f"trainmem: rank {n - 1} of {n}: error: --tokens: token id 99999 is out of range"
               in err, "the failing rank's message, with its rank, on stderr", out, err)
        expect(took < 60, f"the job took {took:.1f} s to end (bound 60 s)", out, err)
        rc, out, err, took = run(n, [a.test_exe, "fail-all"])
        expect(rc == 2, f"every rank failing alike: job exit {rc}, expected 2", out, err)
        expect(err.count("token id 99999") == 1,
               f"the shared message printed once, not {err.count('token id 99999')} times",
               out, err)
        expect("MPI_ABORT" not in out + err, "every rank reached the agreement: no MPI_Abort",
               out, err)
        expect(took < 60, f"the job took {took:.1f} s to end (bound 60 s)", out, err)

    elif a.mode == "timeout":
        rc, out, err, took = run(n, [a.test_exe, "timeout"])
        expect(rc != 0, "a peer that never joins must fail the job", out, err)
        expect("all_reduce_sum (1 fp32) timed out: rank 0 of " + str(n) + " waited" in err,
               "the timeout names the collective, the rank and the wait", out, err)
        expect("--collective-timeout 2)" in err, "the timeout names its setting", out, err)
        expect(took < 60, f"the job took {took:.1f} s to end (bound 60 s)", out, err)

    elif a.mode == "cli":
        base = [a.trainmem, "profile", "--model", "tiny", "--batch", "2", "--seq", "16",
                "--backend", "cpu", "--collective-timeout", "60", "--dtype", "fp32"]
        tmp = tempfile.mkdtemp(prefix="trainmem-mpi-cli-")
        timeline = os.path.join(tmp, "t.json")
        rc, out, err, _ = run(n, base + ["--world-size", str(n), "--zero", "2", "--format", "json",
                                         "--timeline", timeline], threads=1)
        expect(rc == 0, f"profile --backend cpu --world-size {n} --zero 2 under mpirun: exit {rc}",
               out, err)
        doc = {}
        try:
            doc = json.loads(out)  # rank 0 alone prints the report
        except ValueError as e:
            expect(False, f"stdout is one JSON document from rank 0 ({e})", out, err)
        if doc:
            ranks = doc.get("measured_ranks", [])
            expect([r["rank"] for r in ranks] == list(range(n)), "every rank in the report", out)
            expect(doc.get("all_ranks_match") is True and
                   all(r["matches_trace"] and r["matches_analytic"] for r in ranks),
                   "every rank's measured ledger equals its trace and the analytic", out)
            expect(doc.get("collective") == "mpi" and doc["run"]["backend"] == "cpu",
                   "backend cpu over mpi", out)
            # The same global batch on one rank: LlamaModel of batch 2·n (docs/distributed.md).
            expect_single_losses(a.trainmem, doc, 2 * n, f"dp {n}", out)
        for r in range(n):
            path = os.path.join(tmp, f"t.rank{r}.json")
            ok = os.path.exists(path)
            if ok:
                with open(path) as f:
                    ok = "traceEvents" in json.load(f)
            expect(ok, f"rank {r}'s timeline {path}", out, err)
        shutil.rmtree(tmp, ignore_errors=True)
        # FSDP2's per-parameter sharding measured (--fsdp2): tiny-awkward's vocabulary of 71
        # rows splits unevenly, so the ranks own different rows and their optimizer states
        # differ; each is checked against the trace of its own index (all_ranks_match), and
        # the losses are the single rank's.
        awk = [x if x != "tiny" else "tiny-awkward" for x in base]
        rc, out, err, _ = run(n, awk + ["--world-size", str(n), "--fsdp2", "--format", "json"],
                              threads=1)
        expect(rc == 0, f"--fsdp2 measured: exit {rc}", out, err)
        if rc == 0:
            doc = json.loads(out)
            states = {r["ledger"]["optimizer_states"] for r in doc["measured_ranks"]}
            expect(doc.get("all_ranks_match") is True and len(doc["measured_ranks"]) == n and
                   len(states) == 2 and doc["layout"]["sharding"] == "per-parameter",
                   "fsdp2: every rank matching its own trace, the last rank owning fewer rows",
                   out)
            expect_single_losses(a.trainmem, doc, 2 * n, "fsdp2", out, model="tiny-awkward")
        # A mixture of experts per rank (dp n, ZeRO-1): the routed experts' flat vector sharded
        # apart from the rest (expert_shard_elements), every rank matching its trace and the
        # analytic, the losses the single rank's of the same global batch.
        moe = [x if x != "tiny" else "tiny-qwen3-moe" for x in base]
        rc, out, err, _ = run(n, moe + ["--world-size", str(n), "--zero", "1", "--format", "json"],
                              threads=1)
        expect(rc == 0, f"tiny-qwen3-moe measured: exit {rc}", out, err)
        if rc == 0:
            doc = json.loads(out)
            rank0 = doc["ranks"][0] if doc.get("ranks") else {}
            expect(doc.get("all_ranks_match") is True, "moe: every rank matches", out)
            expect(rank0.get("expert_params") == 2 * 8 * 3 * 36 * 64 and
                   rank0.get("expert_shard_elements") == -(-2 * 8 * 3 * 36 * 64 // n),
                   "moe: the experts' own flat vector, sharded over the n ranks", out)
            expect_single_losses(a.trainmem, doc, 2 * n, "moe dp", out, model="tiny-qwen3-moe")
        # Expert parallelism measured: --ep 2 (every rank's ledger against its own trace given
        # the rows its experts received; the model states against the analytic), the losses the
        # single rank's; --dump-routing writes every rank's choices (rank 0), and the meta trace
        # given that file reproduces every measured rank's books and takes it at ep 4 too.
        # A capacity per rank (docs/distributed.md, "A capacity per rank"): --capacity-factor
        # under context parallelism, each rank's capacity over its own b·s/cp tokens; every
        # rank's ledger equal to its trace and the analytic (E·c expert rows); under --ep 2 each
        # rank sends the choices it keeps, every ledger equal to its trace given the kept rows.
        # Its --dump-routing counts the choices before the drops, so the meta trace given that
        # file (clamped per source by the capacity) reproduces every rank.
        # Under --etp 2 (ep 1) the gathered rows are the kept ones too: each rank's ledger
        # against its trace given them (a balanced trace would not match once a choice drops).
        for ep in (["--ep", "1"], ["--ep", "2"], ["--etp", "2"]) if n % 2 == 0 else ():
            tmp = tempfile.mkdtemp(prefix="trainmem-mpi-routing-")
            routes = os.path.join(tmp, "routes.json")
            layout = ["--world-size", str(n), "--cp", "2", *ep, "--attention", "flash",
                      "--capacity-factor", "0.5", "--format", "json"]
            rc, out, err, _ = run(n, moe + layout + ["--dump-routing", routes], threads=1)
            expect(rc == 0 and json.loads(out).get("all_ranks_match") is True,
                   f"--capacity-factor 0.5 --cp 2 {' '.join(ep)} measured: exit {rc}", out, err)
            if rc == 0:
                k = moe.index("--collective-timeout")
                spec = [x if x != "cpu" else "meta" for x in moe[1:k] + moe[k + 2:]] + layout
                expect_routing_reproduced(a.trainmem, json.loads(out), spec, routes,
                                          f"capacity 0.5 cp 2 {' '.join(ep)}", out)
            shutil.rmtree(tmp, ignore_errors=True)
        # ZeRO-3 of the experts too (docs/distributed.md, "ZeRO-3 and offload of the experts"): the experts'
        # parameters sharded over the expert-data-parallel ranks and gathered per layer; and
        # with both shards' states, gradients and parameters offloaded to the host.
        for zero in ("1", "3", "3+offload") if n % 2 == 0 else ():
            tmp = tempfile.mkdtemp(prefix="trainmem-mpi-routing-")
            routes = os.path.join(tmp, "routes.json")
            layout = ["--world-size", str(n), "--zero", zero[0], "--format", "json"]
            if zero.endswith("offload"):
                layout += ["--offload", "optimizer+params"]
            rc, out, err, _ = run(n, moe + layout + ["--ep", "2", "--dump-routing", routes],
                                  threads=1)
            expect(rc == 0, f"--ep 2 --zero {zero} measured: exit {rc}", out, err)
            if rc == 0:
                doc = json.loads(out)
                expect(doc.get("all_ranks_match") is True and doc["layout"]["ep"] == 2,
                       f"ep 2 zero {zero}: every rank matches its routed trace", out)
                expect_single_losses(a.trainmem, doc, 2 * n, f"moe ep 2 zero {zero}", out,
                                     model="tiny-qwen3-moe")
                k = moe.index("--collective-timeout")
                spec = [x if x != "cpu" else "meta" for x in moe[1:k] + moe[k + 2:]] + layout
                expect_routing_reproduced(a.trainmem, doc, spec + ["--ep", "2"], routes,
                                          f"ep 2 zero {zero}", out)
                if n == 4 and zero == "1":  # the same choices placed over 4 experts' ranks
                    rc2, out2, err2 = single(a.trainmem, spec + ["--ep", "4", "--routing",
                                                                 routes])
                    expect(rc2 == 0 and json.loads(out2).get("all_ranks_match") is True,
                           f"ep 4 given the ep 2 run's routing: exit {rc2}", out2, err2)
            shutil.rmtree(tmp, ignore_errors=True)
        if n == 4:
            # ep with context parallelism (ep 4 over dp 2 × cp 2, ZeRO-2) and with pipeline
            # stages (pp 2, ep 2, 2 micro-batches): every rank matches, the single rank's losses,
            # the meta trace given the dumped routing reproduces every rank.
            for extra, rows in ((["--cp", "2", "--ep", "4", "--attention", "flash", "--zero",
                                  "2"], 4),
                                (["--pp", "2", "--ep", "2", "--microbatches", "2", "--zero",
                                  "1"], 8)):
                tmp = tempfile.mkdtemp(prefix="trainmem-mpi-routing-")
                routes = os.path.join(tmp, "routes.json")
                rc, out, err, _ = run(n, moe + ["--world-size", str(n), "--format", "json",
                                                "--dump-routing", routes] + extra, threads=1)
                expect(rc == 0, f"{' '.join(extra)} measured: exit {rc}", out, err)
                if rc == 0:
                    doc = json.loads(out)
                    expect(doc.get("all_ranks_match") is True, f"{extra}: every rank matches",
                           out)
                    expect_single_losses(a.trainmem, doc, rows, " ".join(extra), out,
                                         model="tiny-qwen3-moe")
                    # Each rank's choices per micro-batch and stage: the meta trace given them
                    # reproduces every rank.
                    k = moe.index("--collective-timeout")
                    spec = [x if x != "cpu" else "meta" for x in moe[1:k] + moe[k + 2:]]
                    expect_routing_reproduced(a.trainmem, doc, spec + ["--world-size", str(n),
                                                                       "--format", "json"] +
                                              extra, routes, " ".join(extra), out)
                shutil.rmtree(tmp, ignore_errors=True)
        if n == 4:
            # A MoE under tensor parallelism (tp 2 with sp, ep 2 over the stage's dp·tp slots;
            # the config's vocabulary made even) and under expert tensor parallelism: every rank
            # matches, the single rank's losses,
            # the meta trace given the dumped routing (each tp rank routes its own rows)
            # reproduces every rank.
            tmp = tempfile.mkdtemp(prefix="trainmem-mpi-moe-tp-")
            cfg = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                              "configs", "tiny-qwen3-moe.json")))
            cfg["vocab_size"] = 96
            config = os.path.join(tmp, "config.json")
            json.dump(cfg, open(config, "w"))
            moe_tp = [x if x != "tiny" else config for x in base]
            # ep 1: the experts' gradients summed over every rank; etp 2 (expert tensor
            # parallelism) with tp 2 sp and with tp 1: each expert's width split over two slots,
            # the received rows gathered over them.
            for tp, ep, etp in (("2", "1", "1"), ("2", "2", "1"), ("2", "2", "2"),
                                ("1", "2", "2")):
                routes = os.path.join(tmp, f"routes-tp{tp}-ep{ep}-etp{etp}.json")
                what = f"moe tp {tp} ep {ep} etp {etp}"
                extra = ["--world-size", "4", "--tp", tp] + (["--sp"] if tp == "2" else []) + [
                    "--ep", ep, "--etp", etp, "--zero", "1", "--format", "json"]
                rc, out, err, _ = run(n, moe_tp + extra + ["--dump-routing", routes], threads=1)
                expect(rc == 0, f"{what} measured: exit {rc}", out, err)
                if rc != 0:
                    continue
                doc = json.loads(out)
                expect(doc.get("all_ranks_match") is True, f"{what}: every rank matches", out)
                rows = 2 * (4 // int(tp))  # b 2 on each of the dp = 4/tp replicas
                expect_single_losses(a.trainmem, doc, rows, what, out, model=config)
                k = moe_tp.index("--collective-timeout")
                spec = [x if x != "cpu" else "meta" for x in moe_tp[1:k] + moe_tp[k + 2:]]
                expect_routing_reproduced(a.trainmem, doc, spec + extra, routes, what, out)
            shutil.rmtree(tmp, ignore_errors=True)
        if n % 2 == 0:
            # Tensor parallelism measured: tp 2 (dp n/2), the same global batch's losses; layer 1
            # alone checkpointed (a per-layer policy: recomputed on every rank, same losses).
            rc, out, err, _ = run(n, base + ["--world-size", str(n), "--tp", "2", "--sp",
                                             "--checkpointing", "layers:1", "--format", "json"],
                                  threads=1)
            expect(rc == 0, f"--tp 2 measured: exit {rc}", out, err)
            if rc == 0:
                doc = json.loads(out)
                expect(doc.get("all_ranks_match") is True, "tp 2: every rank matches", out)
                expect_single_losses(a.trainmem, doc, n, "tp 2 sp layers:1", out)
            # Pipeline stages measured: pp 2 with 3 micro-batches (global batch 3·2·n/2 rows),
            # each rank also fed to the caching allocator model (--allocator): its reserve must
            # equal its stage's meta trace's (the same allocations; all_ranks_match checks it).
            rc, out, err, _ = run(n, base + ["--world-size", str(n), "--pp", "2",
                                             "--microbatches", "3", "--format", "json",
                                             "--allocator", "pytorch",
                                             "--checkpointing", "selective"],
                                  threads=1)
            expect(rc == 0, f"--pp 2 measured: exit {rc}", out, err)
            if rc == 0:
                doc = json.loads(out)
                expect(doc.get("all_ranks_match") is True and
                       sorted({r["stage"] for r in doc["measured_ranks"]}) == [0, 1],
                       "pp 2: both stages measured and matching", out)
                expect(all(r["allocator_model"]["reserved_peak"] >=
                           r["allocator_model"]["allocated_peak"] >= r["ledger"]["peak"] > 0
                           for r in doc["measured_ranks"]),
                       "pp 2 --allocator: every rank's reserve >= allocated >= its ledger peak",
                       out)
                expect_single_losses(a.trainmem, doc, 3 * n, "pp 2 selective", out)
            # Offload measured, the optimizer's and the activations': the host bytes of every
            # rank (its states and its host ledger's peak) equal the analytic's; the copies are
            # exact, so the losses are the single rank's.
            rc, out, err, _ = run(n, base + ["--world-size", str(n), "--zero", "3", "--offload",
                                             "optimizer+params", "--offload-activations",
                                             "--format", "json"], threads=1)
            expect(rc == 0, f"--offload optimizer+params --offload-activations measured: exit {rc}",
                   out, err)
            if rc == 0:
                doc = json.loads(out)
                expect(doc.get("all_ranks_match") is True and
                       all(r["host_bytes"] == doc["ranks"][0]["host_bytes"] > 0
                           for r in doc["measured_ranks"]),
                       "offload: every rank's host bytes equal the analytic's", out)
                expect_single_losses(a.trainmem, doc, 2 * n, "ZeRO-3 offload + activations", out)
            # Context parallelism measured: the sequence over cp ranks (ring attention over MPI
            # sends), with dp n/cp; the same global batch's losses as one rank running the
            # whole sequence. cp 2 under ZeRO-1 with full checkpointing (the ring runs again in
            # the recompute); cp n (4 ranks: three ring steps, two receive buffers) with tp 1.
            for cp, extra in ([2, ["--zero", "1", "--checkpointing", "full"]],
                              [n, ["--checkpointing", "layers:1"]]):
                rc, out, err, _ = run(n, base + ["--world-size", str(n), "--cp", str(cp),
                                                 "--attention", "flash", "--format", "json"]
                                      + extra, threads=1)
                expect(rc == 0, f"--cp {cp} measured: exit {rc}", out, err)
                if rc == 0:
                    doc = json.loads(out)
                    expect(doc.get("all_ranks_match") is True,
                           f"cp {cp}: every rank's ledger equals its trace and the analytic", out)
                    expect_single_losses(a.trainmem, doc, 2 * n // cp, f"cp {cp}", out,
                                         ["--attention", "flash"])
            # cuda with --pp: measured like the cpu's where every rank has a GPU and NCCL is
            # built; otherwise exit 2 with the reason (the device or NCCL, not the layout), once.
            cuda = [w if w != "cpu" else "cuda" for w in base]
            rc, out, err, _ = run(n, cuda + ["--world-size", str(n), "--pp", "2",
                                             "--format", "json"])
            if rc == 0:
                doc = json.loads(out)
                expect(doc.get("all_ranks_match") is True, "cuda pp 2: every rank matching", out)
            else:
                expect(rc == 2, f"--backend cuda --pp 2: exit {rc}, expected 0 or 2", out, err)
                expect("--pp" not in err.split("error:")[-1] and
                       ("device" in err or "NCCL" in err),
                       "cuda --pp 2: refused for the device or NCCL, not the layout", out, err)
                expect(err.count("error:") == 1, "the reason said once, by rank 0", out, err)
        if n == 2:
            # One rank out of memory: stage 0 holds more than stage 1, a --device-budget between
            # their traced peaks stops stage 0 alone; the job ends with its exit code 3 and its
            # message (the other rank waits in a receive: MPI_Abort after the grace).
            layout = ["--world-size", "2", "--pp", "2", "--microbatches", "3"]
            meta = [w if w != "cpu" else "meta" for w in base[2:]]
            rc0, out0, err0 = single(a.trainmem, ["profile"] + meta + layout +
                                     ["--format", "json"])
            expect(rc0 == 0, f"the meta trace of pp 2: exit {rc0}", out0, err0)
            if rc0 == 0:
                peaks = [r["ledger"]["peak"] for r in json.loads(out0)["ranks"]]
                expect(peaks[0] > peaks[1], f"stage 0 peaks above stage 1: {peaks}", out0)
                budget = (peaks[0] + peaks[1]) // 2
                tmp = tempfile.mkdtemp(prefix="trainmem-mpi-oom-")
                report = os.path.join(tmp, "oom.json")
                rc, out, err, took = run(n, base + layout + ["--device-budget", str(budget),
                                                             "--format", "json", "--output",
                                                             report], threads=1)
                expect(rc == 3, f"stage 0 out of memory: exit {rc}, expected 3", out, err)
                expect("trainmem: rank 0 of 2: out of memory: allocating" in err and
                       "rank 1 of 2: out of memory" not in err,
                       "rank 0's out-of-memory message (requested bytes, tensor, live), rank 0 "
                       "alone", out, err)
                expect(took < 60, f"the job took {took:.1f} s to end (bound 60 s)", out, err)
                # The failing rank's partial report, its rank in the name: what failed, what was
                # alive, its books up to the failure (under the budget) beside its stage's trace.
                part = os.path.join(tmp, "oom.rank0.json")
                expect(os.path.exists(part) and not os.path.exists(report) and
                       not os.path.exists(os.path.join(tmp, "oom.rank1.json")),
                       f"rank 0 alone wrote its partial report: {os.listdir(tmp)}", out, err)
                if os.path.exists(part):
                    with open(part) as f:
                        doc = json.load(f)
                    e = doc.get("error", {})
                    live = e.get("live_tensors", [])
                    expect(doc.get("complete") is False and doc.get("rank") == 0 and
                           e.get("kind") == "out_of_memory" and
                           e.get("live_bytes", 0) + e.get("requested_bytes", 0) > budget and
                           e.get("live_bytes", budget + 1) <= budget and
                           sum(t["bytes"] for t in live) == e.get("live_bytes") and
                           doc["ledger"]["peak"] <= budget < doc["trace_ledger"]["peak"] and
                           doc["trace_ledger"]["peak"] == peaks[0],
                           "the partial report: the failure over the budget, what was alive "
                           "summing to the live bytes, the books under it, stage 0's trace above",
                           json.dumps(doc)[:3000])
                shutil.rmtree(tmp, ignore_errors=True)

        # --weights and --tokens: the golden tiny GQA model's files (2 rows of 16 ids) as the
        # global batch; the job's losses equal the single-rank run that loaded them.
        data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
        files = ["--model", os.path.join(data, "golden_tiny_gqa_config.json"), "--seq", "16",
                 "--weights", os.path.join(data, "golden_tiny_gqa_weights.safetensors"),
                 "--tokens", os.path.join(data, "golden_tiny_gqa_tokens.bin"),
                 "--backend", "cpu", "--dtype", "fp32", "--format", "json"]
        rc1, out1, err1 = single(a.trainmem, ["profile", "--batch", "2"] + files)
        expect(rc1 == 0, f"the single-rank run of the golden files: exit {rc1}", out1, err1)
        layouts = ([["--tp", "2", "--batch", "2"], ["--pp", "2", "--microbatches", "2",
                                                     "--batch", "1"]] if n == 2 else
                   [["--tp", "2", "--batch", "1"], ["--tp", "2", "--pp", "2",
                                                    "--microbatches", "2", "--batch", "1"]])
        for lay in layouts if rc1 == 0 else []:
            want = json.loads(out1)["run"]["losses"]
            rc, out, err, _ = run(n, [a.trainmem, "profile", "--world-size", str(n),
                                      "--collective-timeout", "60"] + lay + files, threads=1)
            expect(rc == 0, f"--weights --tokens {' '.join(lay)}: exit {rc}", out, err)
            if rc == 0:
                doc = json.loads(out)
                got = doc.get("losses", [])
                expect(doc.get("all_ranks_match") is True and len(got) == len(want) == 2 and
                       all(abs(g - w) <= 1e-5 * abs(w) for g, w in zip(got, want)),
                       f"--weights --tokens {' '.join(lay)}: losses {got} equal the single "
                       f"rank's {want} within 1e-5, every rank matching", out)
        # --collectives: nccl is the cuda backend's; mpi on cuda needs a device (exit 0 where one
        # is usable, 2 saying why otherwise), said once.
        rc, out, err, _ = run(n, base + ["--world-size", str(n), "--collectives", "nccl"])
        expect(rc == 2 and err.count("error:") == 1 and
               "--collectives nccl needs --backend cuda" in err,
               f"--collectives nccl on cpu: exit {rc} (2), said once", out, err)
        cuda_mpi = [w if w != "cpu" else "cuda" for w in base]
        rc, out, err, _ = run(n, cuda_mpi + ["--world-size", str(n), "--collectives", "mpi",
                                             "--zero", "1", "--format", "json"], threads=1)
        if rc == 0:
            doc = json.loads(out)
            expect(doc.get("all_ranks_match") is True and doc.get("collective") == "mpi-staged",
                   "cuda --collectives mpi: every rank matching, over mpi-staged", out)
        else:
            expect(rc == 2 and err.count("error:") == 1 and
                   ("no usable CUDA device" in err or "built without CUDA" in err),
                   f"cuda --collectives mpi without a device: exit {rc} (2), said once", out, err)
        # The file must hold the global batch: one row too few is exit 2 saying so, once.
        rc, out, err, _ = run(n, [a.trainmem, "profile", "--world-size", str(n),
                                  "--collective-timeout", "60", "--dp", str(n), "--batch", "2"] +
                              files, threads=1)
        expect(rc == 2 and err.count("error:") == 1 and
               "with --world-size the file holds the global batch, dp·M·b" in err,
               f"--tokens short of the global batch: exit {rc} (2), said once", out, err)

        # compare: checkpointing none and full on every rank, each against its analytic.
        cmp = [a.trainmem, "compare"] + base[2:] + ["--world-size", str(n), "--zero", "1",
                                                     "--format", "json"]
        rc, out, err, _ = run(n, cmp, threads=1)
        expect(rc == 0, f"compare --world-size {n} measured: exit {rc}", out, err)
        if rc == 0:
            doc = json.loads(out)
            rows = doc.get("rows", [])
            expect(doc.get("all_match") is True and len(rows) == n,
                   "compare: a row per rank, every one matching", out)
            expect(all(r["full"]["activations_peak"] < r["none"]["activations_peak"]
                       for r in rows), "checkpointing lowers every rank's activations peak", out)
        # A bad flag value of a measured command: every rank meets it before the ranks meet; they
        # agree over MPI and rank 0 alone says so. A command that never starts MPI (estimate)
        # prints it per rank and ends at once (no rank waits for the others in MPI_Init).
        rc, out, err, _ = run(n, base + ["--world-size", str(n), "--format", "md"])
        expect(rc == 2, f"--format md under mpirun: exit {rc}, expected 2", out, err)
        expect(err.count("unknown format 'md'") == 1, "the flag error said once", out, err)
        rc, out, err, took = run(n, [a.trainmem, "estimate", "--model", "tiny", "--format", "md"])
        # (mpirun ends the others once one exits non-zero: each rank that got that far says it.)
        expect(rc == 2 and 1 <= err.count("unknown format 'md'") <= n,
               f"estimate --format md under mpirun: exit {rc}, said by the ranks that met it",
               out, err)
        expect(took < 30, f"estimate's error took {took:.1f} s to end the job", out, err)
        rc, out, err, _ = run(n, base + ["--world-size", str(2 * n)])
        expect(rc == 2, f"--world-size {2 * n} under mpirun -np {n}: exit {rc}, expected 2",
               out, err)
        expect(err.count(f"--world-size {2 * n} but the MPI launcher started {n} process(es)")
               == 1, "the mismatch said once, with both numbers", out, err)
        expect(f"mpirun -np {2 * n} trainmem profile" in err and
               f"mpirun -np {n} trainmem profile" in err and f"--world-size {n}" in err,
               "the mismatch message says what to run instead", out, err)
        # Ranks started with different requests (mpirun's MPMD form `A : B`): every rank stops
        # before the first collective with the same message naming the flag, its values and the
        # ranks; exit 2, said once, well before any timeout; never a corrupted heap.
        half = n // 2
        for flag, mine, theirs in (("--seed", "1", "2"), ("--model", "tiny", "tiny-gqa"),
                                   ("--batch", "2", "3"), ("--zero", "1", "2"),
                                   ("--steps", "2", "3")):
            def cmd(value):
                args = [w for w in base]
                if flag in args:
                    k = args.index(flag)
                    args[k + 1] = value
                else:
                    args += [flag, value]
                return args + ["--world-size", str(n), "--dp", str(n)]
            mpmd = ["-np", str(half)] + cmd(mine)[:] + [":", "-np", str(n - half)] + cmd(theirs)
            rc, out, err, took = run_mpmd(mpmd)
            expect(rc == 2, f"MPMD ranks with {flag} {mine} / {theirs}: exit {rc} (2)", out, err)
            want = (f"{flag} is '{mine}' on rank{'s' if half > 1 else ''} " +
                    ", ".join(str(r) for r in range(half)))
            expect(err.count("the ranks were started with different requests") == 1 and want in err,
                   f"MPMD {flag}: the difference named once ({want!r})", out, err)
            expect(took < 60, f"MPMD {flag}: the job took {took:.1f} s to end", out, err)
        # A timeout below the floor is refused before MPI starts (it made every collective time
        # out at once, and the abort ran into freed buffers).
        for bad in ("1e-300", "1e-9"):
            rc, out, err, _ = run(n, base + ["--world-size", str(n), "--collective-timeout", bad])
            expect(rc == 2 and "--collective-timeout: must be between 1 and 604800" in err,
                   f"--collective-timeout {bad}: exit {rc} (2), naming its bounds", out, err)
    else:
        print(f"unknown mode {a.mode}")
        return 2

    if problems:
        print(f"mpi_test.py {a.mode} np {n}: {len(problems)} problem(s)")
        return 1
    print(f"mpi_test.py {a.mode} np {n}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
