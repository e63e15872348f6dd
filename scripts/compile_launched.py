"""Compile for sm_90, without a GPU, every kernel variant that small fits launch.

``compile_sm90.py`` compiles the variants of the benchmark shapes' passes; this covers the rest
(the bounds engine, k-means++, empty-cluster relocations, ...) at small shapes' configs. The fits
run on CPU tensors through Triton's interpreter (``TORCHKM_ENGINE=triton``), which records each
launch's kernel and argument types; a second process, without the interpreter, compiles each
distinct variant with the installed Triton as ``compile_sm90.py`` does (its bundled ptxas), and
prints ``ok`` or ``FAIL`` per variant.

    python scripts/compile_launched.py [--algorithms lloyd pruned] [--out launches.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def record(path: str, algorithms: list[str]) -> None:
    """Run small fits under the interpreter and write each launch's kernel and arguments to ``path``."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    import torchkm

    launches: dict[str, dict] = {}
    run = InterpretedFunction.run

    def describe(v):
        if isinstance(v, torch.Tensor):
            return {"tensor": str(v.dtype).removeprefix("torch.")}
        if isinstance(v, (bool, int, float, str)) or v is None:
            return {"value": v}
        return {"value": getattr(v, "value", repr(v))}  # a constexpr

    def recording_run(self, *args, grid, warmup, **kwargs):
        spec = {"module": self.fn.__module__, "name": self.fn.__name__,
                "args": [describe(a) for a in args], "kwargs": {k: describe(v) for k, v in kwargs.items()}}
        launches.setdefault(json.dumps(spec, sort_keys=True), spec)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording_run
    g = torch.Generator().manual_seed(0)
    for d, k in ((40, 70), (24, 7), (3, 20)):
        x = torch.randn(1500, d, generator=g)
        for algorithm in algorithms:
            for precision in ("exact", "fast"):
                for init in ("k-means++", x[:3].repeat(k // 3 + 1, 1)[:k]):  # (the second: empty clusters)
                    try:
                        torchkm.fit(x, k, init=init, algorithm=algorithm, precision=precision, max_iter=6,
                                    random_state=0)
                    except Exception as e:  # noqa: BLE001 - a combination the API refuses: its launches so far count
                        print("fit refused:", d, k, algorithm, precision, repr(e)[:200], file=sys.stderr)
        torchkm.assign(x, x[:k])
    with open(path, "w") as f:
        json.dump(list(launches.values()), f)
    print(len(launches), "distinct launches recorded", file=sys.stderr)


def compile_all(path: str) -> int:
    """Compile each recorded launch for sm_90 (``compile_sm90.Compiler``); the count of failures."""
    import torch

    sys.path.insert(0, HERE)
    import compile_sm90  # noqa: F401  (patches the modules' launchers: only its Compiler is used here)

    failures = 0
    with open(path) as f:
        specs = json.load(f)
    for spec in specs:
        fn = getattr(importlib.import_module(spec["module"]), spec["name"])  # (the JITFunction, no interpreter here)

        def build(d):
            return torch.empty(1, dtype=getattr(torch, d["tensor"])) if "tensor" in d else d["value"]

        try:
            compile_sm90.Compiler(fn)(*map(build, spec["args"]), **{k: build(v) for k, v in spec["kwargs"].items()})
        except Exception as e:  # noqa: BLE001 - report every failing variant
            failures += 1
            print("FAIL", spec["module"], spec["name"], type(e).__name__, str(e).splitlines()[-1:] if str(e) else "",
                  flush=True)
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=["lloyd", "pruned"])
    parser.add_argument("--out", help="where the recorded launches go (default: a temporary file)")
    parser.add_argument("--compile", dest="compile_path", help=argparse.SUPPRESS)  # (the second process)
    args = parser.parse_args()
    if args.compile_path:
        sys.exit(1 if compile_all(args.compile_path) else 0)
    path = args.out or os.path.join(tempfile.mkdtemp(), "launches.json")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TORCHKM_ENGINE": "triton"}
    code = f"import sys; sys.path.insert(0, {HERE!r}); import compile_launched as c; c.record({path!r}, {args.algorithms!r})"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TORCHKM_ENGINE")}
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--compile", path], env=env)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
