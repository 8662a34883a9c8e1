"""Tests of the pypto 0.2.0 harness kernels/pypto_rt.

The ``pypto`` tests run real kernels (fixtures/*.py) in worker processes. The first run
on a machine builds the calculator (~30 s); later runs take it from the cache.
"""

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kernels.pypto_rt import KernelJob, PyptoError, WorkerPool, calculator, cycles, diagnose, run_jobs, verify_csv

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]
BF16 = ml_dtypes.bfloat16


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# ---- numpy references -------------------------------------------------------------------

def matmul_ref(a, b):
    return a.astype(np.float32) @ b.astype(np.float32)


def rmsnorm_ref(x, gamma, eps=1e-6):
    xf, gf = x.astype(np.float32), gamma.astype(np.float32)
    mean_sq = (xf * xf).sum(-1, keepdims=True) * np.float32(1.0 / x.shape[-1])
    inv_rms = (1.0 / np.sqrt(mean_sq + np.float32(eps))).astype(np.float32)
    return (xf * inv_rms * gf).astype(BF16)


def bf16_ulps(a, b):
    """Distance in bf16 units in the last place (finite values of one sign)."""
    ia = a.view(np.int16).astype(np.int32)
    ib = b.view(np.int16).astype(np.int32)
    return np.abs(ia - ib)


# ---- inputs -----------------------------------------------------------------------------

RNG = np.random.default_rng(20261129)
# Small integers: every product and partial sum is exact in fp32, so any summation order
# gives the same result and the matmul must match the reference bit for bit.
MM_A = RNG.integers(-4, 5, (64, 256)).astype(BF16)
MM_B = RNG.integers(-4, 5, (256, 192)).astype(BF16)
RMS_X = RNG.standard_normal((64, 1024)).astype(BF16)
RMS_G = (1.0 + 0.1 * RNG.standard_normal((1, 1024))).astype(BF16)


def mm_job(mode, **kw):
    return KernelJob(fixture("matmul_bf16.py"), "matmul_bf16", {"a": MM_A, "b": MM_B},
                     {"out": ((64, 192), np.float32)}, mode=mode, **kw)


def rms_job(entry, mode, source="rmsnorm_bf16.py", **kw):
    return KernelJob(fixture(source), entry, {"x": RMS_X, "gamma": RMS_G},
                     {"out": ((64, 1024), "bf16")}, mode=mode, **kw)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """One run_jobs call: two good kernels, a wrong one, a UB overflow, then more jobs."""
    jobs = [
        mm_job("full", label="mm", goldens={"out": matmul_ref(MM_A, MM_B)}),
        rms_job("rmsnorm_bf16", "full", label="rms", goldens={"out": rmsnorm_ref(RMS_X, RMS_G)}),
        rms_job("rmsnorm_no_mean", "full", source="broken.py", label="wrong",
                goldens={"out": rmsnorm_ref(RMS_X, RMS_G)}),
        KernelJob(fixture("broken.py"), "ub_overflow", {"x": np.zeros((512, 512), np.float32)},
                  {"out": ((512, 512), "float32")}, mode="compile", label="ub"),
        mm_job("compile", label="mm-compile"),
        rms_job("rmsnorm_bf16", "sim", label="rms-sim"),
        KernelJob(fixture("matmul_bf16.py"), "matmul_bf16", {"a": MM_A.astype(np.float32), "b": MM_B},
                  {"out": ((64, 192), np.float32)}, mode="compile", label="bad-dtype"),
    ]
    scratch = tmp_path_factory.mktemp("scratch")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(scratch))
        patch.delenv("DSPARK_KEEP_PYPTO_TMP", raising=False)
        results = run_jobs(jobs, artifacts_dir=tmp_path_factory.mktemp("artifacts"))
    assert list(scratch.iterdir()) == []  # worker temp dirs are deleted, failed ones too
    return {r.label: r for r in results}


# ---- full mode: real numbers, cycles, pass verify ------------------------------------------

@pytest.mark.pypto
def test_matmul_full_is_exact(batch):
    res = batch["mm"].check()
    assert res.outputs["out"].dtype == np.float32
    np.testing.assert_array_equal(res.outputs["out"], matmul_ref(MM_A, MM_B))
    assert res.cycles > 0 and res.tasks > 0 and res.us == res.cycles / 1800
    assert res.verify_ok, [str(r) for r in res.verify]
    assert {r.pass_name for r in res.verify} >= {"tensor_graph", "Pass_04_ExpandFunction",
                                                  "Pass_36_CodegenPreproc"}
    assert res.swimlane is not None and res.swimlane.is_file()


@pytest.mark.pypto
def test_rmsnorm_full_matches_bf16_reference(batch):
    res = batch["rms"].check()
    out, ref = res.outputs["out"], rmsnorm_ref(RMS_X, RMS_G)
    assert out.dtype == BF16
    # pypto sums in torch's fp32 order, numpy in its own: a rounding tie may land one
    # bf16 ulp apart, never more, and only rarely.
    ulps = bf16_ulps(out, ref)
    assert ulps.max() <= 1 and np.count_nonzero(ulps) <= out.size // 1000
    assert res.cycles > 0
    assert res.verify_ok, [str(r) for r in res.verify]


@pytest.mark.pypto
def test_full_mode_leaves_inputs_intact(batch):
    for label in ("mm", "rms", "wrong"):
        assert batch[label].clobbered == []


@pytest.mark.pypto
def test_wrong_kernel_gives_wrong_numbers_and_failed_verify(batch):
    res = batch["wrong"].check()  # it runs fine: it is just wrong
    ref = rmsnorm_ref(RMS_X, RMS_G).astype(np.float32)
    assert np.abs(res.outputs["out"].astype(np.float32) - ref).max() > 0.5
    failed = [r for r in res.verify_failed if r.pass_name == "tensor_graph"]
    assert failed and failed[0].error_count > 0
    assert not res.verify_ok


# ---- failures ------------------------------------------------------------------------------

@pytest.mark.pypto
def test_ub_overflow_fails_with_one_line_cause(batch):
    res = batch["ub"]
    assert not res.ok
    assert "\n" not in res.error
    assert "exceeds MEM_UB size" in res.error
    assert "schedule_base" in res.log  # the plog excerpt is kept
    with pytest.raises(PyptoError) as info:
        res.check()
    assert str(info.value).startswith("ub: Run pass failed") and "\n" not in str(info.value)


@pytest.mark.pypto
def test_jobs_after_a_failure_run_in_a_fresh_worker(batch):
    assert batch["mm"].worker_pid == batch["ub"].worker_pid
    after = batch["mm-compile"]
    assert after.ok and after.worker_pid != batch["ub"].worker_pid
    assert batch["rms-sim"].ok


# ---- compile and sim modes -----------------------------------------------------------------

@pytest.mark.pypto
def test_compile_mode_only_compiles(batch):
    res = batch["mm-compile"]
    assert res.ok and res.cycles is None and res.verify == []
    assert not res.outputs["out"].any()  # nothing ran, the output is untouched
    assert res.wall_s < 5


@pytest.mark.pypto
def test_sim_mode_gives_cycles_but_no_numbers(batch):
    res = batch["rms-sim"]
    assert res.cycles > 0 and res.verify == []
    assert not res.outputs["out"].astype(np.float32).any()


@pytest.mark.pypto
def test_crash_timeout_and_kept_temp_dirs(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("DSPARK_KEEP_PYPTO_TMP", "1")
    jobs = [  # two worker chains: [ok, hang] and [crash]
        mm_job("compile", label="ok"),
        KernelJob("import os\nos._exit(7)\n", "k", {}, {}, mode="compile", label="crash"),
        KernelJob("import time\ntime.sleep(600)\n", "k", {}, {}, mode="compile", label="hang"),
    ]
    ok, crash, hang = run_jobs(jobs, timeout=4, workers=2)
    assert ok.ok and ok.worker_pid == hang.worker_pid != crash.worker_pid
    assert not crash.ok and crash.error == "worker died (exit code 7) during the call"
    assert not hang.ok and hang.error == "timed out after 4 s (worker killed)"
    kept = list(tmp_path.glob("dspark-pypto-*"))
    assert len(kept) == 2  # both workers had a failure: DSPARK_KEEP_PYPTO_TMP=1 keeps their dirs
    assert str(kept[0]) in (crash.log + hang.log)


# ---- persistent workers (WorkerPool) ----------------------------------------------------------

@pytest.mark.pypto
def test_pool_keeps_its_worker_across_batches_and_replaces_a_failed_one(tmp_path, monkeypatch):
    """One worker serves batch after batch (no new `import pypto`); it loads the calculator when the
    first `full` job comes; after a failed job the rest go to a fresh worker, which then stays."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("DSPARK_KEEP_PYPTO_TMP", raising=False)
    ub = KernelJob(fixture("broken.py"), "ub_overflow", {"x": np.zeros((512, 512), np.float32)},
                   {"out": ((512, 512), "float32")}, mode="compile", label="ub")
    with WorkerPool(workers=1) as pool:
        # started without the calculator; (shape, dtype) inputs: made (uninitialised) by the worker
        [first] = pool.run([KernelJob(fixture("matmul_bf16.py"), "matmul_bf16",
                                      {"a": ((64, 256), "bf16"), "b": ((256, 192), "bf16")},
                                      {"out": ((64, 192), np.float32)}, mode="compile", label="first")])
        [mm] = pool.run([mm_job("full", label="mm", goldens={"out": matmul_ref(MM_A, MM_B)})])
        np.testing.assert_array_equal(mm.check().outputs["out"], matmul_ref(MM_A, MM_B))
        assert mm.cycles > 0 and mm.verify == []  # verify rows come when the worker exits
        bad, rms = pool.run([ub, rms_job("rmsnorm_bf16", "full", label="rms",
                                         goldens={"out": rmsnorm_ref(RMS_X, RMS_G)})])
        [last] = pool.run([mm_job("compile", label="last")])
    assert first.ok and first.worker_pid == mm.worker_pid == bad.worker_pid
    assert first.outputs["out"].shape == (64, 192) and not first.outputs["out"].any()
    assert not bad.ok and "exceeds MEM_UB size" in bad.error
    assert rms.ok and rms.worker_pid == last.worker_pid != bad.worker_pid
    assert pool.started == 2
    assert mm.verify_ok and rms.verify_ok, [str(r) for r in mm.verify + rms.verify]
    assert list(tmp_path.iterdir()) == []  # both worker directories are gone
    with pytest.raises(PyptoError, match="closed"):
        pool.run([mm_job("compile")])


@pytest.mark.pypto
def test_started_pool_gives_sim_artifacts_when_run_returns(tmp_path, monkeypatch):
    """`start` runs the worker before the first batch; a sim job's pypto output is copied when `run` returns
    (a long-lived pool serves the cost model), not only when the worker exits; `close(kill=True)` cleans up."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    pool = WorkerPool(workers=1, artifacts_dir=tmp_path / "art")
    pool.start()
    assert pool.started == 1 and pool.slots[0].alive
    [res] = pool.run([rms_job("rmsnorm_bf16", "sim", label="rms-sim")])
    assert res.ok and res.cycles > 0 and res.artifacts is not None
    assert list(res.artifacts.glob("*/CostModelSimulationOutput/_simulate.swim.json"))
    assert pool.started == 1
    pid = res.worker_pid
    pool.close(kill=True)
    assert list((tmp_path / "scratch").iterdir()) == []
    assert list(res.artifacts.glob("*/CostModelSimulationOutput/_simulate.swim.json"))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.pypto
def test_bad_job_arguments_are_reported(batch):
    assert batch["bad-dtype"].error == "tensor 'a' is float32 but the kernel declares DT_BF16"


# ---- no pypto needed -----------------------------------------------------------------------

def test_package_imports_without_pypto_or_torch():
    code = "import sys, kernels.pypto_rt; print(sorted({'pypto', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_job_validation():
    with pytest.raises(PyptoError, match="mode must be one of"):
        KernelJob("", "k", {}, {}, mode="fast")
    with pytest.raises(PyptoError, match="both input and output"):
        KernelJob("", "k", {"x": np.zeros(2)}, {"x": np.zeros(2)})
    with pytest.raises(PyptoError, match="unknown jit option groups"):
        KernelJob("", "k", {}, {}, options={"verify": {}})
    job = KernelJob("", "k", {"i": ((4,), "i32")}, {"o": ((2, 3), "bf16")})
    assert job.outputs["o"] == ((2, 3), np.dtype(BF16)) and job.label == "k"
    assert job.inputs["i"] == ((4,), np.dtype(np.int32))
    with pytest.raises(PyptoError, match="input 'i' must be an array or a"):
        KernelJob("", "k", {"i": [1, 2]}, {})


STAT_REPORT = """\
=================ASC++ MachineModel Report==================
Total Cycles.....................................:     21887
================DeviceMachine 72 Statistics=================
Total Submit Tasks...............................:         3
  |--Cube Tasks..................................:         3  100.00%
  |--Vector Tasks................................:         0    0.00%
Average Task Cycles..............................:   7153.00
================Core Machine Top Statistics=================
Total Cycles.....................................:     21887
Used Cube Pipe Number............................:         3
Average Cube Usage...............................:    299.00    1.37%
Used MTE_IN Pipe Number..........................:         3
Average MTE_IN Usage.............................:   6308.00   28.82%
"""


def test_stat_report_parsing():
    stats = cycles.parse_stat_report(STAT_REPORT)
    assert (stats.total_cycles, stats.tasks, stats.cube_tasks, stats.vector_tasks) == (21887, 3, 3, 0)
    assert stats.pipes["MTE_IN"] == cycles.PipeUsage(3, 6308.0, 28.82)
    assert stats.us == pytest.approx(21887 / 1800)
    assert cycles.parse_stat_report("nothing here") is None


def test_verify_csv_parsing(tmp_path):
    csv_dir = tmp_path / "verify_1"
    csv_dir.mkdir()
    (csv_dir / verify_csv.BRIEF_CSV).write_text(
        "funcID,passName,referPassName,verifyType,loopInfo,ioflag,outputShape,outputValidShape,"
        "outputDtype,outputTensor,goldenTensor,verifyResult,rtol,atol,maxAbsDiff,maxRelDiff,"
        "averageAbsDiff,averageRelDiff,errorCount,errorRatio,zeroCount,zeroRatio,timeStamp\n"
        '1,tensor_graph,golden,F,loop_idx_0=0,output2,"[64, 192]","[64, 192]",DT_FP32,a,b,FAILED,'
        "0.001,0.001,5.5,0.9,0.1,0.1,12,0.01,0,0,1\n")
    [row] = verify_csv.read_verify_rows(tmp_path)
    assert (row.pass_name, row.shape, row.result, row.error_count) == ("tensor_graph", "[64, 192]", "FAILED", 12)
    assert not row.passed and row.max_abs_diff == 5.5


def test_error_diagnosis():
    plog = textwrap.dedent("""\
        [ERROR] PYPTO(1):2026-11-29 16:50:58.034 [dev_encode_types.h:150][MACHINE]:ErrCode: F7A001! idx < size_
        [ERROR] PYPTO(1):2026-11-29 16:50:58.034 [schedule_base.h:423][PASS]:[OoOScheduleBase.Operation]:UB_ALLOC[10011] checkOpBufferSize failed!
        [ERROR] PYPTO(1):2026-11-29 16:50:58.034 [schedule_base.h:347][PASS]:[OoOScheduleBase.Operation]:Alloc tensor [43] size [1048576] exceeds MEM_UB size [196608]!
        """)  # noqa: E501 (log lines as pypto writes them)
    exc = ("Errcode: FFFFFF!\nRun pass failed., func CompileFunction, file host_machine.cpp, line 179\n"
           "libx.so(f+0x1) [0x2]")
    assert diagnose.cause("RenderedParserError", exc, [], plog) == \
        "Run pass failed: Alloc tensor [43] size [1048576] exceeds MEM_UB size [196608]!"
    record = "Record function k failed: TypeError: Test condition must be a symbolic scalar"
    tile = "Errcode: F21004!\nop [A_MUL_B]tile shape not set, func Operation, file operation.cpp, line 178"
    assert diagnose.cause("RenderedParserError", tile, [record], "") == record
    assert diagnose.cause("ValueError", "bad value\nmore", [], "") == "ValueError: bad value more"


def test_calculator_cache_is_built_once_under_concurrency(tmp_path):
    """Two processes ask for the calculator at once: one builds, both get the same entry."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from kernels.pypto_rt import calculator
        calculator._torch_facts = lambda: ("9.9.9", 1, calculator.Path("/nonexistent"))
        def fake_compile(src_dir, work, *args):
            with open({str(tmp_path / "builds.log")!r}, "a") as log:
                log.write("build\\n")
            time.sleep(1.5)
            (work / "lib.so").write_bytes(b"not really a library")
            return work / "lib.so"
        calculator._compile = fake_compile
        print(calculator.build().path)
    """)
    env = dict(os.environ, DSPARK_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    paths = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    assert (tmp_path / "builds.log").read_text() == "build\n"
    entry = Path(paths.pop()).parent
    assert entry.parent == tmp_path / "cache" / "pypto-calculator"
    assert entry.name.startswith("torch-9.9.9-cxx11abi1-")
    assert sorted(p.name for p in entry.parent.iterdir() if not p.name.endswith(".lock")) == [entry.name]
    assert calculator.cache_root() != entry.parent or "DSPARK_CACHE_DIR" in os.environ


def test_a_worker_exits_when_its_runner_dies():
    """A worker whose runner is killed mid-job must not simulate on as an orphan: the parent watch exits it, also
    when the runner is gone before the worker's imports are done (the runner's pid is the worker's argument)."""
    import time

    child = ("import sys, time; from kernels.pypto_rt.worker import exit_with_parent; "
             "exit_with_parent(int(sys.argv[1]), 0.05); time.sleep(60)")
    parent = (f"import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid())], "
              "stdout=subprocess.DEVNULL); print(p.pid, flush=True)")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _running(pid):
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    raise AssertionError("the orphaned worker was still running 10 s after its parent exited")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit may wait for a reaper that is not ours)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
