"""The docs cannot rot: every command in README.md and docs/*.md is run by a test.

A command is every line of a fenced ```sh / ```bash / ```console block (`# comments` dropped,
`\\` continuations joined, a console block's `$ ` lines) and every inline code span that starts
like a command (`python -m `, `python -c `, `python3 `, `make `, `horovodrun `, `sbatch `,
`.venv/bin/`). Each must be covered in one of these ways, checked in this order:

RUN      this file runs it (cheap ones only, all at once, each with a generous timeout): exit 0 and
         an expected output; `python`/`python3` are this interpreter, /tmp paths go to a temp dir.
TEXT     its text (whitespace-normalised) is a string literal in another tests/*.py, or a list
         literal there reads as it (`sys.executable` read as `python`), and that test runs it.
MAPPED   a test named here runs the same command with its own temporary paths or launcher (Slurm
         jobs, the DAWNBench run, the convergence run); the test must exist, and where the test keeps
         its arguments in constants they are compared with the doc's.
CI       `make test` (what .ci/run runs) and what it implies (`make install`, the marker loop).
FLAGS    long runs (hour-long benchmark defaults), templates (`ROOT`, `...`) and GPU-only tools:
         NOT run. The check is on the command line only: the program exists and every long option
         the doc shows is declared by an `add_argument` of that program's parser (read from its
         source, so no TensorFlow import), the benchmark name exists, the make target exists.
         Listed by hand in tests/doc_commands.py, each with its reason, so a new doc command never
         lands here unseen.

Every RUN, MAPPED and FLAGS command also gets the FLAGS check. A command in none of them fails
`test_every_doc_command_is_covered` with the command and the doc file that shows it; a table entry
that no doc shows any more fails too.
"""
import ast
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
INLINE = ("python -m ", "python -c ", "python3 ", "make ", "horovodrun ", "sbatch ", ".venv/bin/")

from tests.doc_commands import CI, FLAGS, MAPPED, RUN

PARSER_SOURCES = {"scripts/dawnbench_resnet50.py": ["tfc_apps/dawnbench/*.py"]}
SBATCH_PROGRAMS = {"scripts/slurm/train.sbatch": ("-m", "tfc_apps.train"),
                   "scripts/slurm/dawnbench.sbatch": ("scripts/dawnbench_resnet50.py",)}
# The README layout table may group top-level entries in one row.
LAYOUT_GROUPS = {"Makefile, setup.py, requirements.txt, pytest.ini", ".ci/, .gitignore, README.md"}


def _norm(s):
    return " ".join(s.split())


def extract(text):
    """The commands of one markdown text, in order."""
    commands, rest, lines, i = [], [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"\s*```(\w*)\s*$", lines[i])
        if not m:
            rest.append(lines[i])
            i += 1
            continue
        lang, i, block = m.group(1), i + 1, []
        while i < len(lines) and not re.match(r"\s*```\s*$", lines[i]):
            block.append(lines[i])
            i += 1
        i += 1
        if lang not in ("sh", "bash", "console"):
            continue
        joined = "\n".join(block).replace("\\\n", " ")
        for line in joined.split("\n"):
            if lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(_norm(line))
    for span in re.findall(r"`([^`]+)`", "\n".join(rest)):
        span = _norm(span)
        if span.startswith(INLINE):
            commands.append(span)
    return commands


def doc_commands():
    """[(command, doc file relative to the root)], each (command, doc) once."""
    seen = {}
    for doc in DOCS:
        for cmd in extract(doc.read_text()):
            seen.setdefault((cmd, str(doc.relative_to(ROOT))), None)
    return list(seen)


def _test_strings():
    """Whitespace-normalised string literals and list literals (read as commands) of the other tests."""
    found = set()
    for path in TESTS.glob("*.py"):
        if path.name in (Path(__file__).name, "doc_commands.py"):   # the tables, not tests that run them
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(_norm(node.value))
            elif isinstance(node, (ast.List, ast.Tuple)):
                words = []
                for e in node.elts:
                    if isinstance(e, ast.Constant) and isinstance(e.value, str):
                        words.append(e.value)
                    elif ast.unparse(e) == "sys.executable":
                        words.append("python")
                    else:
                        words.append("\0")   # anything else breaks a match
                found.add(_norm(" ".join(words)))
    return found


def _source_files(program):
    """The source files of a program: a module name or a script path."""
    if program.endswith((".py", ".sh")):
        paths = [ROOT / program]
    else:
        base = ROOT / program.replace(".", "/")
        paths = [p for p in (base.with_suffix(".py"), base / "__main__.py") if p.exists()]
    for pattern in PARSER_SOURCES.get(program, []):
        paths += sorted(ROOT.glob(pattern))
    return paths


def _declared_options(paths):
    options = {"-h", "--help"}
    for path in paths:
        tree = ast.parse(path.read_text())
        aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and getattr(node.value, "attr", "") == "add_argument"
                   for t in node.targets if isinstance(t, ast.Name)}   # a = p.add_argument
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (getattr(node.func, "attr", "") == "add_argument"
                                               or getattr(node.func, "id", "") in aliases):
                options.update(a.value for a in node.args if isinstance(a, ast.Constant)
                               and isinstance(a.value, str) and a.value.startswith("-"))
    return options


def _check_program(program, args, problems):
    paths = _source_files(program)
    if not paths or not all(p.exists() for p in paths):
        problems.append(f"no source for {program}")
        return
    declared = _declared_options(paths)
    for arg in args:
        opt = arg.strip("[]").split("=")[0]   # "..." and positional arguments pass
        if opt.startswith("--") and opt not in declared:
            problems.append(f"{program} has no option {opt}")


def _check_python(tokens, problems):
    """tokens after `python`: -c CODE, -m MODULE ARGS or SCRIPT ARGS."""
    if not tokens or tokens[0] == "-c":
        return
    if tokens[0] == "-m":
        module, args = tokens[1], tokens[2:]
    else:
        module, args = tokens[0], tokens[1:]
    if module in ("tfc_apps.cluster_launch", "tfc_apps.slurm") and "--" in args:
        cut = args.index("--")
        _check_program(module, args[:cut], problems)
        if args[cut + 1:] == ["CMD"]:   # the template of any command
            return
        return check_command_line(" ".join(map(shlex.quote, args[cut + 1:])), problems)
    if module == "tfc_apps.bench":
        if not args or args[0] not in re.search(r"BENCHMARKS = \(([^)]*)\)",
                                                 (ROOT / "tfc_apps/bench/__main__.py").read_text()).group(1):
            if args and args[0] not in ("-h", "--help"):
                problems.append(f"tfc_apps.bench has no benchmark {args[:1]}")
            return
        module, args = f"tfc_apps.bench.{args[0]}", args[1:]
    elif module == "datacache":
        if args[:1] != ["warm"]:
            problems.append("python -m datacache has only the subcommand warm")
        module, args = "datacache/cli.py", args[1:]
    _check_program(module, args, problems)


def check_command_line(cmd, problems=None):
    """FLAGS check of one command; returns the list of problems (empty: the command line is valid)."""
    problems = [] if problems is None else problems
    tokens = shlex.split(cmd)
    while tokens and re.match(r"^[A-Z_]+=", tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return problems
    head = tokens[0]
    if head == "horovodrun":
        i = 1
        while i < len(tokens) and tokens[i] not in ("env", "python", "python3"):
            i += 1
        tokens = tokens[i:]
        if tokens[:1] == ["env"]:
            tokens = tokens[1:]
            while tokens and "=" in tokens[0]:
                tokens = tokens[1:]
        head = tokens[0] if tokens else ""
    if head in ("python", "python3"):
        _check_python(tokens[1:], problems)
    elif head == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        problems.extend(f"Makefile has no target {t}" for t in tokens[1:] if t not in targets)
    elif head == "sbatch":
        script = next((t for t in tokens[1:] if not t.startswith("-")), None)
        if script not in SBATCH_PROGRAMS or not (ROOT / script).exists():
            problems.append(f"unknown batch script {script}")
        else:
            _check_python([*SBATCH_PROGRAMS[script], *tokens[tokens.index(script) + 1:]], problems)
    elif head == "scripts/emulate_cluster.sh":
        usage = re.search(r'usage: \$0 ([^"]*)"', (ROOT / head).read_text()).group(1)
        if tokens[1] not in re.findall(r"\b(up|reshape|down|status)\b", usage):
            problems.append(f"emulate_cluster.sh has no subcommand {tokens[1]}")
        if tokens[1] == "up" and "--inter-mbit" not in tokens:
            problems.append("emulate_cluster.sh up needs --inter-mbit")
    elif head == "bash" and tokens[1:2] == ["scripts/build_horovod.sh"]:
        script = (ROOT / tokens[1]).read_text()
        problems.extend(f"build_horovod.sh has no option {t}" for t in tokens[2:] if t.startswith("--")
                        and f'"{t}"' not in script)
    elif head == ".venv/bin/pytest":
        markers = re.findall(r"^\s+(\w+):", (ROOT / "pytest.ini").read_text(), re.M)
        for word in re.findall(r"\b(\w+)\b", " ".join(tokens[tokens.index("-m") + 1:][:1])):
            if word not in ("not", "and", "or") and word not in markers:
                problems.append(f"pytest.ini registers no marker {word}")
    else:
        problems.append(f"no check knows the program {head}")
    return problems


def _covered(cmd, strings):
    if cmd in RUN:
        return "RUN"
    if cmd in strings:
        return "TEXT"
    for kind, table in (("MAPPED", MAPPED), ("CI", CI), ("FLAGS", FLAGS)):
        if cmd in table:
            return kind
    return None


def test_every_doc_command_is_covered():
    strings = _test_strings()
    uncovered, invalid = [], []
    for cmd, doc in doc_commands():
        kind = _covered(cmd, strings)
        if kind is None:
            uncovered.append(f"{doc}: {cmd}")
            continue
        problems = check_command_line(cmd)
        if problems:
            invalid.append(f"{doc}: {cmd}: {'; '.join(problems)}")
    assert not uncovered, ("commands that no test runs (run them in a test, or add them to a table in "
                           "tests/doc_commands.py):\n" + "\n".join(uncovered))
    assert not invalid, "commands whose command line is wrong:\n" + "\n".join(invalid)


def test_every_table_entry_is_still_in_a_doc():
    shown = {cmd for cmd, _ in doc_commands()}
    stale = [cmd for table in (RUN, MAPPED, CI, FLAGS) for cmd in table if cmd not in shown]
    assert not stale, f"tests/doc_commands.py lists commands that no doc shows: {stale}"


def test_mapped_tests_exist_and_match():
    for cmd, (path, name) in MAPPED.items():
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{cmd}: {path} has no {name}"
    from tests import test_dawnbench, test_emulated_cluster, test_slurm

    dawn = next(c for c in MAPPED if "dawnbench_resnet50.py" in c)
    tokens = shlex.split(dawn)
    assert tokens[:6] == ["horovodrun", "-np", "4", "-H", "localhost:4", "--gloo"]
    assert tokens[tokens.index("--data") + 2:] == test_dawnbench.DIGITS
    assert (test_emulated_cluster.M, test_emulated_cluster.N, test_emulated_cluster.MBIT) == (2, 2, 200)
    slurm = "sbatch -N1 -n4 --overcommit scripts/slurm/train.sbatch --algorithm hitopk --epochs 3 --batch-size 32 --topology 2x2"
    assert shlex.split(slurm)[1:4] == test_slurm.SBATCH
    assert shlex.split(slurm)[5:] == test_slurm.ARGS + test_slurm.TOPOLOGY
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: install\n\t\$\(PY\) -m tfc_apps\.demo$", makefile, re.M), "make demo's recipe changed"


def test_ci_runs_make_test():
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: install\n\t\$\(VENV\)/bin/python -m pytest -q tests$", makefile, re.M), makefile
    assert "slow:" in (ROOT / "pytest.ini").read_text() and "multiprocess:" in (ROOT / "pytest.ini").read_text()


def _run(cmd, tmp_path):
    expect, timeout = RUN[cmd]
    argv = shlex.split(cmd.replace("/tmp/", f"{tmp_path}/"))
    argv[0] = sys.executable
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env)
    except subprocess.TimeoutExpired:
        return f"{cmd}: timed out after {timeout} s"
    if proc.returncode != 0 or expect not in proc.stdout:
        return f"{cmd}: exit {proc.returncode}, expected {expect!r} in:\n{(proc.stdout + proc.stderr)[-2000:]}"
    return None


def test_run_commands(tmp_path):
    """The RUN commands, all at once (most of their time is importing TensorFlow)."""
    with concurrent.futures.ThreadPoolExecutor(len(RUN)) as pool:
        failures = [f for f in pool.map(lambda c: _run(c, tmp_path), RUN) if f]
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(not (os.environ.get("NVCC") or shutil.which("nvcc")), reason="make cuda-check needs nvcc")
@pytest.mark.slow   # nvcc compiles every CUDA source: minutes
@pytest.mark.timeout(900)
def test_make_cuda_check():
    proc = subprocess.run(["make", "cuda-check"], capture_output=True, text=True, timeout=850, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def test_readme_layout_matches_git_ls_files():
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    top = {f.split("/")[0] + ("/" if "/" in f else "") for f in files}
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout"):]
    rows = re.findall(r"^\| ([^|]+) \| [^|]+ \|$", table, re.M)[2:]   # after the header and the rule
    listed = []
    for row in rows:
        entries = [e.strip().strip("`") for e in row.replace("`, `", ", ").split(", ")]
        assert len(entries) == 1 or ", ".join(entries) in LAYOUT_GROUPS, f"unknown group {row}"
        listed += entries
    assert sorted(listed) == sorted(top), f"README layout {sorted(listed)} != git ls-files {sorted(top)}"


def test_no_doc_says_not_built_yet():
    for doc in DOCS:
        for phrase in ("not built yet", "not yet built", "TODO"):
            assert phrase.lower() not in doc.read_text().lower(), f"{doc.name} says {phrase!r}"


def test_doc_links_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#:]+)\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"
