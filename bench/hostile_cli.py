"""A hostile user's campaign against the ``espresso`` command line.

Run: python bench/hostile_cli.py [--jobs N] [--only SUBSTRING] [--show]

Every case runs ``espresso`` in a fresh process under a wall-clock limit and is classed as

* ``traceback`` (Python's ``Traceback`` or ``Exception ignored`` in the output),
* ``internal`` (the CLI's last net turned an unforeseen exception into one line: a bug),
* ``abort`` (killed by a signal, or exit 134/139),
* ``block`` (still running at the limit),
* ``overrun`` (a ``--time-limit`` case that took more than its limit plus a margin),
* ``clobbered`` (a device, FIFO, socket or symlink given as an output changed kind),
* ``accepted`` (an input the case marks bad exited 0),
* ``ok``.

Inputs: every file argument of every command with a FIFO, a directory, ``/dev/null``,
``/dev/zero``, a socket, symlinks to those, an empty path, a missing file, binary bytes,
an empty file and a name too long for the file system; every output with ``/dev/full``,
``/dev/null``, a FIFO, a directory, a socket, a symlink (to a file, to nothing, to a device),
an empty path, a read-only folder; standard output on a full disk and on a closed pipe; bad
numbers on every numeric flag. The counts of every class but ``ok`` must be 0 (issue 25).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ESPRESSO = [sys.executable, "-m", "espresso.cli"]
LIMIT_S = 60.0


@dataclass
class Case:
    args: list[str]
    bad: bool = False          # the input is wrong: the command must not exit 0
    stdout: str | None = None  # "full" (/dev/full) or "pipe" (closed after 10 bytes)
    time_limit: float | None = None  # the --time-limit the case gives
    keep: list[str] = field(default_factory=list)  # special files that must keep their kind


def fixtures(d: Path) -> dict[str, str]:
    """Special files in ``d``; returns name -> path."""
    out: dict[str, str] = {}
    fifo = d / "fifo"
    os.mkfifo(fifo)
    out["fifo"] = str(fifo)
    (d / "dir").mkdir()
    out["dir"] = str(d / "dir")
    out["null"] = _device(d / "null", 3, "/dev/null")
    out["zero"] = _device(d / "zero", 5, "/dev/zero")
    sock = d / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))  # left bound for the campaign's life
    out["sock"] = str(sock)
    out["_socket_obj"] = s  # type: ignore[assignment]
    (d / "link-fifo").symlink_to(fifo)
    out["link-fifo"] = str(d / "link-fifo")
    out["empty-path"] = ""
    out["missing"] = str(d / "nope" / "missing.yaml")
    (d / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    out["binary"] = str(d / "binary.yaml")
    (d / "empty.yaml").write_text("")
    out["empty"] = str(d / "empty.yaml")
    out["long"] = "x" * 5000
    (d / "dup.yaml").write_text("gpus:\n  - name: A\n    memory_gb: 80\n    memory_gb: 40\n")
    out["dup"] = str(d / "dup.yaml")
    return out


def _device(path: Path, minor: int, fallback: str) -> str:
    """A character device like /dev/null (major 1) at ``path``, or ``fallback``."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except OSError:
        return fallback
    return str(path)


def outputs(d: Path) -> dict[str, str]:
    # Private device nodes where this process may make them (root): an output that a bug
    # replaced with a file is then this folder's, not the machine's /dev/null.
    out: dict[str, str] = {"full": _device(d / "ofull", 7, "/dev/full"),
                           "null": _device(d / "onull", 3, "/dev/null")}
    os.mkfifo(d / "ofifo")
    out["fifo"] = str(d / "ofifo")
    (d / "odir").mkdir()
    out["dir"] = str(d / "odir")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "osock"))
    out["sock"] = str(d / "osock")
    out["_socket_obj"] = s  # type: ignore[assignment]
    (d / "target.json").write_text("{}")
    (d / "olink").symlink_to(d / "target.json")
    out["link"] = str(d / "olink")
    (d / "odangling").symlink_to(d / "nowhere.json")
    out["dangling"] = str(d / "odangling")
    (d / "olink-null").symlink_to(out["null"])
    out["link-null"] = str(d / "olink-null")
    out["empty-path"] = ""
    ro = d / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    out["ro"] = str(ro / "x.json")
    out["nofolder"] = str(d / "no" / "such" / "x.json")
    return out


def kind(path: str) -> str:
    try:
        m = os.lstat(path).st_mode
    except OSError:
        return "none"
    for test, name in ((stat.S_ISLNK, "link"), (stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "chr"),
                       (stat.S_ISSOCK, "sock"), (stat.S_ISDIR, "dir"), (stat.S_ISREG, "reg")):
        if test(m):
            return name
    return "other"


def cases(fx: dict[str, str], ox: dict[str, str], good: dict[str, str]) -> list[Case]:
    plan, hosts, suite = good["plan"], good["hosts"], good["suite"]
    small = ["--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "7d", "--catalog",
             "builtin:gpus", "--time-limit", "5"]
    out: list[Case] = []
    bad_inputs = [k for k in fx if not k.startswith("_")]
    # ---- every file argument with every bad input
    file_args: list[tuple[list[str], list[str]]] = [
        (["gpus", "--catalog"], []),
        (["offers", "--catalog"], []),
        (["offers", "--quota"], []),
        (["plan", *small[:-4], "--time-limit", "5", "--catalog"], []),
        (["plan", *small, "--quota"], []),
        (["plan", "--tokens", "1e9", "--deadline", "7d", "--time-limit", "5", "--model"], []),
        (["plan", *small, "--job"], []),
        (["plan", *small, "--cost-model"], []),
        (["plan", *small, "--profile"], ["PREFIX=A100-80GB="]),
        (["estimate"], []),
        (["estimate", plan, "--catalog"], []),
        (["estimate", plan, "--cost-model"], []),
        (["frontier", "--model", "gpt3-1.3b", "--tokens", "1e9", "--time-limit", "5",
          "--catalog"], []),
        (["frontier", "--tokens", "1e9", "--time-limit", "5", "--job"], []),
        (["profile", "--gpu", "A100-80GB", "--out", "/tmp/espresso-hostile-prof.json",
          "--model"], []),
        (["calibrate", "--out", "/tmp/espresso-hostile-cal.yaml", "--bench"], []),
        (["calibrate", "--out", "/tmp/espresso-hostile-cal.yaml", "--profile"], []),
        (["launch", "--hosts", hosts], ["PLAN_FIRST"]),
        (["launch", plan, "--hosts"], []),
        (["export", "skypilot", "--out", "/tmp/espresso-hostile-sky"], ["PLAN_FIRST"]),
        (["export", "skypilot", good["plan_noest"], "--out", "/tmp/espresso-hostile-sky",
          "--catalog"], []),
        (["bench", "run", "--out", "/tmp/espresso-hostile-bench"], ["PLAN_FIRST"]),
        (["bench", "report"], []),
    ]
    for base, flags in file_args:
        for k in bad_inputs:
            if k == "dup" and base[-1] not in ("--catalog", "--quota", "--job", "--cost-model"):
                continue
            val = fx[k]
            if "PREFIX=A100-80GB=" in flags:
                val = "A100-80GB=" + val
            if "PLAN_FIRST" in flags:
                args = [base[0], *base[1:2], val, *base[2:]] if base[0] in (
                    "export", "bench") else [base[0], val, *base[1:]]
            else:
                args = [*base, val]
            out.append(Case(args, bad=True, keep=[val] if k in ("null", "zero") else []))
    # ---- every output with every bad target
    out_args: list[list[str]] = [
        ["plan", *small, "--json"],
        ["plan", *small, "--plot"],
        ["estimate", plan, "--json"],
        ["frontier", "--model", "gpt3-1.3b", "--tokens", "1e9", "--catalog", "builtin:gpus",
         "--time-limit", "5", "--max-points", "2", "--json"],
        ["bench-gpu", "--json"],
        ["calibrate", "--profile", good["profile"], "--out"],
        ["launch", plan, "--hosts", hosts, "--out-dir"],
        ["export", "skypilot", plan, "--out"],
        ["bench", "run", suite, "--jobs", "1", "--out"],
    ]
    for base in out_args:
        for k, val in ox.items():
            if k.startswith("_"):
                continue
            target = val
            if base[-1] == "--plot" and val.endswith(".json"):
                target = val.replace(".json", ".png")
            # a symlink to a file or to nothing is written through; everything else refused
            folder = base[-1] == "--out-dir" or (base[-1] == "--out" and base[0] in (
                "export", "bench"))
            must_fail = k not in (("dir", "nofolder", "dangling") if folder
                                  else ("link", "dangling"))
            if k == "ro" and os.geteuid() == 0:
                must_fail = False  # root writes in a read-only folder
            keep = [target] if k in ("full", "null", "fifo", "sock", "link", "dangling",
                                     "link-null", "dir") else []
            out.append(Case([*base, target], bad=must_fail, keep=keep))
    # ---- stdout that cannot be written
    for args in (["gpus"], ["gpus", "--json"], ["models"], ["models", "--json"], ["offers"],
                 ["offers", "--json"], ["estimate", plan], ["plan", *small],
                 ["launch", plan, "--hosts", hosts], ["estimate", plan, "--json", "-"],
                 ["frontier", "--model", "gpt3-1.3b", "--tokens", "1e9", "--catalog",
                  "builtin:gpus", "--time-limit", "5", "--max-points", "2"],
                 ["--help"], ["plan", "--help"]):
        out.append(Case(args, stdout="full", bad=True))
        out.append(Case(args, stdout="pipe"))
    # ---- bad values
    num_flags = {
        "plan": ["--seq-len", "--global-batch", "--tokens", "--iterations", "--deadline",
                 "--deadline-confidence", "--threads", "--time-limit", "--budget", "--top-k",
                 "--max-stages", "--max-tp", "--virtual-stages", "--interleave-after",
                 "--max-instances", "--spot-rate", "--spot-recovery", "--checkpoint-gbs"],
    }
    values = ["0", "-1", "-1d", "nan", "inf", "-inf", "1e309", "1.5", "", "abc", "1,,2",
              "99999999999999999999", "0x10", " 3", "1e-300"]
    for flag in num_flags["plan"]:
        for val in values:
            args = ["plan", "--model", "gpt3-1.3b", "--catalog", "builtin:gpus",
                    "--time-limit", "5"]
            defaults = {"--tokens": "1e9", "--deadline": "7d"}
            for f, dv in defaults.items():
                if f != flag and not (flag == "--iterations" and f == "--tokens"):
                    args += [f, dv]
            if flag == "--time-limit":
                args = [a for a in args if a not in ("--time-limit", "5")]
            out.append(Case([*args, f"{flag}={val}" if val.startswith("-") else flag, *(
                [] if val.startswith("-") else [val])], bad=_bad_value(flag, val)))
    for val in ("-1", "0", "70000", "abc", ""):
        out.append(Case(["launch", plan, "--hosts", hosts, f"--port={val}"], bad=True))
        out.append(Case(["export", "skypilot", plan, "--out", "/tmp/espresso-hostile-sky2",
                         f"--port={val}"], bad=True))
    for args in (
            ["plan", *small, "--tokens", "1e9", "--iterations", "100"],
            ["plan", "--model", "gpt3-1.3b", "--iterations", "1.5", "--deadline", "7d",
             "--catalog", "builtin:gpus"],
            ["plan", *small, "--max-stages", "1,,2"],
            ["plan", "--model", "x" * 5000, "--tokens", "1e9", "--deadline", "7d"],
            ["offers", "--provider", "nope"],
            ["offers", "--gpu", "nope"],
            ["offers", "--region", "nowhere-*"],
            ["gpus", "--catalog", f"skypilot:nope={good['vms']}"],
            ["export", "skypilot", plan, "--out", ""],
            ["export", "skypilot", plan, "--out", "/tmp/espresso-hostile-sky3",
             "--catalog", "/nonexistent.yaml"],
            ["plan", *small, "--json", ""],
            ["profile", "--model", "gpt3-1.3b", "--gpu", "A100-80GB", "--out",
             "/tmp/espresso-hostile-p.json", "--micro-batch", "0"],
            ["profile", "--model", "gpt3-1.3b", "--gpu", "A100-80GB", "--out",
             "/tmp/espresso-hostile-p.json", "--device", "nope"],
            ["profile", "--model", "gpt3-1.3b", "--gpu", "A100-80GB", "--out",
             "/tmp/espresso-hostile-p.json", "--device", "cuda:7"],
            ["profile", "--model", "gpt3-1.3b", "--gpu", "A100-80GB", "--out",
             "/tmp/espresso-hostile-p.json", "--seq-len", "0"],
            ["profile", "--model", "gpt3-1.3b", "--gpu", "A100-80GB", "--out",
             "/tmp/espresso-hostile-p.json", "--repeats", "0"],
            ["estimate", good["bad_rent_list"]],
            ["estimate", good["bad_rent_num"]],
            ["bench", "report", good["bad_rows_dir"]],
            ["bench", "report", good["bin_rows_dir"]],
            ["bench", "run", suite, "--out", good["existing_file"]],
            ["calibrate", "--cpu", "--cores", "0", "--out", "/tmp/espresso-hostile-c.yaml"],
    ):
        out.append(Case(args, bad=True))
    # ---- time limits that bind
    big = good.get("big")
    if big:
        for t in ("0.3", "1"):
            for thr in ("1", "2", "64"):
                out.append(Case(["plan", "--model", "llama2-70b", "--tokens", "1e11",
                                 "--deadline", "7d", "--catalog", big, "--spot",
                                 "--time-limit", t, "--threads", thr], time_limit=float(t)))
    return out


ZERO_OK = ("--spot-rate", "--spot-recovery", "--checkpoint-gbs", "--max-instances")
WHOLE = ("--seq-len", "--global-batch", "--tokens", "--iterations", "--threads", "--top-k",
         "--max-tp", "--max-instances", "--max-stages", "--virtual-stages", "--interleave-after")


def _bad_value(flag: str, val: str) -> bool:
    """Whether ``flag`` must refuse ``val`` (other values may be refused or taken)."""
    if val in ("-1", "-1d", "nan", "", "abc", "1,,2", "0x10", "-inf"):
        return True
    return (val == "0" and flag not in ZERO_OK) or (val == "1.5" and flag in WHOLE)


def run(case: Case, cwd: Path) -> tuple[str, str]:
    env = {**os.environ, "COLUMNS": "120"}
    start = time.monotonic()
    stdout: int | None = subprocess.PIPE
    fh = None
    if case.stdout == "full":
        fh = open("/dev/full", "w")  # noqa: SIM115
        stdout = fh.fileno()
    try:
        if case.stdout == "pipe":
            # `cmd | head -c 10`: the reader takes 10 bytes and goes away
            with subprocess.Popen([*ESPRESSO, *case.args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, cwd=cwd, env=env) as p:
                assert p.stdout is not None and p.stderr is not None
                p.stdout.read(10)
                p.stdout.close()
                try:
                    err = p.stderr.read().decode(errors="replace")
                    rc = p.wait(timeout=LIMIT_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    return "block", ""
                text = err
        else:
            r = subprocess.run([*ESPRESSO, *case.args], stdout=stdout, stderr=subprocess.PIPE,
                               cwd=cwd, env=env, timeout=LIMIT_S)
            rc = r.returncode
            text = (r.stdout or b"").decode(errors="replace") + r.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return "block", ""
    finally:
        if fh is not None:
            fh.close()
    took = time.monotonic() - start
    if "Traceback (most recent call last)" in text or "Exception ignored" in text:
        return "traceback", text[-1500:]
    if "error: internal error" in text:  # the CLI's last net caught an unforeseen exception
        return "internal", text[-800:]
    if rc < 0 or rc in (134, 139):
        return "abort", f"rc {rc}: {text[-500:]}"
    if case.time_limit is not None and took > case.time_limit + 1.0:
        return "overrun", f"{took:.2f} s for --time-limit {case.time_limit}"
    if case.bad and rc == 0:
        return "accepted", text[-600:]
    if case.stdout == "full" and rc == 0:
        return "accepted", "exit 0 with stdout on a full disk"
    return "ok", f"rc {rc}: {text.strip().splitlines()[-1] if text.strip() else ''}"[:300]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", help="only cases whose command line contains this")
    ap.add_argument("--show", action="store_true", help="print every case's outcome")
    ap.add_argument("--big", help="a big offers catalog for the time-limit cases")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="espresso-hostile-"))
    try:
        return _campaign(work, args)
    finally:
        for p in work.rglob("*"):
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(work, ignore_errors=True)


def _campaign(work: Path, args: argparse.Namespace) -> int:
    (work / "in").mkdir()
    (work / "out").mkdir()
    fx = fixtures(work / "in")
    ox = outputs(work / "out")
    good = _good_files(work)
    if args.big:
        good["big"] = args.big
    todo = cases(fx, ox, good)
    if args.only:
        todo = [c for c in todo if any(args.only in a for a in c.args)]
    before = {p: kind(p) for c in todo for p in c.keep}
    counts: dict[str, int] = {}
    bad: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futs = {pool.submit(run, c, work): c for c in todo}
        for fut in concurrent.futures.as_completed(futs):
            c = futs[fut]
            cls, detail = fut.result()
            counts[cls] = counts.get(cls, 0) + 1
            shown = " ".join(a if len(a) < 60 else a[:20] + "..." for a in c.args)
            line = (f"[{cls}] espresso {shown}"
                    + (f" (stdout {c.stdout})" if c.stdout else ""))
            if cls != "ok":
                bad.append(f"{line}\n    {detail.strip()[-800:]}")
            elif args.show:
                print(f"{line}\n    {detail}")
    clobbered = [p for p, k in before.items() if kind(p) != k]
    for p in clobbered:
        bad.append(f"[clobbered] {p}: was {before[p]}, now {kind(p)}")
    counts["clobbered"] = len(clobbered)
    for line in bad:
        print(line)
    print(json.dumps({"cases": len(todo), **counts}, sort_keys=True))
    return 0 if all(n == 0 for k, n in counts.items() if k != "ok") else 1


def _good_files(work: Path) -> dict[str, str]:
    g = work / "good"
    g.mkdir()
    run_ = [*ESPRESSO, "plan", "--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "7d",
            "--catalog", "builtin:gpus", "--json", str(g / "plan.json")]
    subprocess.run(run_, check=True, capture_output=True)
    data = json.loads((g / "plan.json").read_text())
    noest = {k: val for k, val in data.items() if k != "estimate"}
    (g / "plan-noest.json").write_text(json.dumps(noest))
    for name, rent in (("bad-rent-list.json", ["x"]), ("bad-rent-num.json", 5.0)):
        (g / name).write_text(json.dumps({**data, "estimate": {**data["estimate"],
                                                               "rent": rent}}))
    gpu = data["stages"][0]["gpu"]
    (g / "hosts.yaml").write_text(
        "hosts:\n" + "".join(f"  - {{address: 10.0.0.{i + 1}, gpu: {gpu}, gpus: 8}}\n"
                             for i in range(8)))
    (g / "suite.yaml").write_text(
        "name: t\ncatalogs: {g: 'builtin:gpus'}\ntokens: [1e9]\ndeadlines: [7d]\n"
        "models: [gpt3-1.3b]\nbaselines: []\nsearch: {time_limit_s: 2}\n")
    import espresso as es

    model = es.ModelSpec.preset("gpt3-1.3b")
    (g / "prof.json").write_text(json.dumps({
        "schema": "espresso.profile/1", "gpu": "A100-80GB", "model": model.to_dict(),
        "micro_batch_size": 1, "seq_len": 128, "dtype": "float32", "device": "cpu",
        "repeats": 1, "block_fwd_s": 0.01, "block_bwd_s": 0.02, "head_fwd_s": 0.01,
        "head_bwd_s": 0.02, "block_activation_bytes": 1e6,
        "block_param_bytes": 2.0 * model.params_per_block}))
    for name, text in (("bad-rows", '{"a":1}\n'), ("bin-rows", None)):
        (g / name).mkdir()
        if text is None:
            (g / name / "rows.jsonl").write_bytes(bytes(range(256)))
        else:
            (g / name / "rows.jsonl").write_text(text)
    (g / "file.txt").write_text("x")
    (g / "vms.csv").write_text("InstanceType,AcceleratorName,AcceleratorCount,Price,Region\n")
    return {"plan": str(g / "plan.json"), "plan_noest": str(g / "plan-noest.json"),
            "bad_rent_list": str(g / "bad-rent-list.json"),
            "bad_rent_num": str(g / "bad-rent-num.json"), "hosts": str(g / "hosts.yaml"),
            "suite": str(g / "suite.yaml"), "profile": str(g / "prof.json"),
            "bad_rows_dir": str(g / "bad-rows"), "bin_rows_dir": str(g / "bin-rows"),
            "existing_file": str(g / "file.txt"), "vms": str(g / "vms.csv")}


if __name__ == "__main__":
    sys.exit(main())
