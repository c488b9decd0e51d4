"""Several cases in one job, so that a test pays one launch (TensorFlow imports, Gloo set-up) for all
of them: each case runs a module as ``python -m MODULE ARGV...`` would (runpy, sys.argv set), one
after another on every rank, with its environment variables set for it alone and its worker
reports (tests/workers/_report.py) in $HVD_TEST_OUT/<case>/. A case that raises ends the job, its
name on stderr. Horovod is initialised once: a later case's tf_commlib.init() finds it initialised
and maps its process sets to the ones already there (the same ranks).

A test runs ``hvdrun.run("sequence_worker.py", N, tmp_path, args=[cases_file(tmp_path, cases)])``."""
import json
import os
import runpy
import sys
from pathlib import Path


def cases_file(tmp_path, cases):
    """Writes cases, {name: (module, argv, env)}, to run in this order; returns the path, the job's
    argument. Each rank reports {name: its report for the case, or None where the case reports nothing}."""
    path = Path(tmp_path) / "cases.json"
    path.write_text(json.dumps({name: {"module": module, "argv": [str(a) for a in argv], "env": dict(env or {})}
                                for name, (module, argv, env) in cases.items()}))
    return path


def _run_case(name, case, rank):
    saved = {k: os.environ.get(k) for k in [*case["env"], "HVD_TEST_OUT"]}
    out = Path(os.environ["HVD_TEST_OUT"], name)
    out.mkdir(exist_ok=True)
    os.environ.update(case["env"], HVD_TEST_OUT=str(out))
    sys.argv = [case["module"], *case["argv"]]
    print(f"rank {rank}: case {name}: python -m {' '.join(sys.argv)}", file=sys.stderr, flush=True)
    try:
        runpy.run_module(case["module"], run_name="__main__", alter_sys=True)
    except BaseException:
        print(f"rank {rank}: case {name} failed", file=sys.stderr, flush=True)
        raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    path = out / f"rank{rank}.json"
    return json.loads(path.read_text()) if path.exists() else None


def main(spec):
    from tests.workers._report import report

    rank = int(os.environ["HOROVOD_RANK"])
    cases = json.loads(Path(spec).read_text())
    report(rank, {name: _run_case(name, case, rank) for name, case in cases.items()})


if __name__ == "__main__":
    main(sys.argv[1])
