"""Prove a deploy bundle runs on arm64 without a board: an emulated Debian bookworm userland under qemu-user.

The root is built once and cached: debootstrap's first stage downloads bookworm's arm64 python3
packages and ``dpkg-deb -x`` unpacks them, so no chroot, binfmt or mounts are needed. The bundle's
own requirements files are installed from aarch64 wheels by the host's pip, one environment per
file (ai-edge-litert, the tflite-runtime 2.14 fallback, onnxruntime). qemu then runs the bundle's
runner.py on the same texts as the host, and the labels must agree with the host's labels of the
model that interpreter picks (a TFLite bundle may carry a fallback model for tflite-runtime). A pass
is recorded beside the bundle (``<bundle>.verified.json``): which interpreter versions loaded which
model file on emulated aarch64. Emulated timings say nothing about a real board, so none are reported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from compress.errors import CompressError
from compress.io import atomic_dir

log = logging.getLogger(__name__)

SUITE, MIRROR, PYTHON_VERSION = "bookworm", "http://deb.debian.org/debian", "3.11"
PYTHON = f"usr/bin/python{PYTHON_VERSION}"
GLIBC_MINOR = 36  # bookworm ships glibc 2.36: wheels tagged manylinux_2_17 ... manylinux_2_36 run there
APT_COMMAND = "apt-get update && apt-get install -y qemu-user-static debootstrap"
READY = ".compress-ready"
VERIFICATION_SCHEMA = "compress.verification/1"
CPU = "cortex-a72"
# onnxruntime parses /proc/cpuinfo at import; under qemu-user it would read the host's x86 file and crash.
CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\n"
    "CPU revision\t: 3\n\n"
    for i in range(4)
)


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "compress" / "arm64-root"


def check_tools() -> None:
    for tool in ("qemu-aarch64-static", "debootstrap", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise CompressError(f"verify-arm needs {tool}; install it as root: {APT_COMMAND}")


def run_tool(command: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise CompressError(f"{what} failed (exit {done.returncode}): {lines[-1]}")
    return done


def build_root(cache: Path) -> Path:
    """The cached bookworm arm64 root with python3; built in a temporary folder and renamed when complete."""
    root = cache / f"{SUITE}-arm64"
    if (root / READY).is_file():
        return root
    if os.geteuid() != 0:
        raise CompressError(
            "building the arm64 root runs debootstrap, which needs root; run verify-arm as root"
        )
    log.info("building the %s arm64 root in %s (once; cached)", SUITE, root)
    with atomic_dir(root) as tmp:
        debootstrap = ["debootstrap", "--foreign", "--arch=arm64", "--variant=minbase", "--include=python3"]
        run_tool([*debootstrap, SUITE, str(tmp), MIRROR], f"debootstrap from {MIRROR}", timeout=1800)
        for deb in sorted((tmp / "var/cache/apt/archives").glob("*.deb")):
            run_tool(["dpkg-deb", "-x", str(deb), str(tmp)], f"dpkg-deb -x {deb.name}")
            deb.unlink()
        (tmp / "proc").mkdir(exist_ok=True)
        (tmp / "proc" / "cpuinfo").write_text(CPUINFO)
        probe = emulate(tmp, ["-c", "import platform; print(platform.machine(), platform.python_version())"])
        done = run_tool(probe, "python3 in the emulated root", env=emulated_env(None, tmp), timeout=300)
        machine, version = done.stdout.split()
        if machine != "aarch64":
            raise CompressError(
                f"{tmp}: emulated python reports {machine}, not aarch64; delete {cache} and retry"
            )
        (tmp / READY).write_text(json.dumps({"suite": SUITE, "mirror": MIRROR, "python": version}))
    return root


def install_env(root: Path, requirements: Path) -> Path:
    """aarch64 wheels for one requirements file in ROOT/opt/site-<its hash>, reused while it is unchanged."""
    text = requirements.read_text(encoding="utf-8")
    site = root / "opt" / f"site-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if (site / READY).is_file():
        return site
    platforms = [f"manylinux_2_{minor}_aarch64" for minor in range(GLIBC_MINOR, 16, -1)] + [
        "manylinux2014_aarch64"
    ]
    with atomic_dir(site) as tmp:
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(tmp)]
        command += ["--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION]
        command += [arg for platform in platforms for arg in ("--platform", platform)]
        run_tool(
            [*command, "-r", str(requirements)], f"pip install -r {requirements.name} (aarch64)", timeout=1800
        )
        (tmp / READY).write_text(text)
    return site


def emulate(root: Path, args: list[str]) -> list[str]:
    return ["qemu-aarch64-static", "-cpu", CPU, "-L", str(root), str(root / PYTHON), *args]


def emulated_env(site: Path | None, home: Path) -> dict[str, str]:
    """A clean environment: nothing of the host's Python (PYTHONPATH, venv) leaks into the emulated one."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1", "HOME": str(home), "LANG": "C.UTF-8"}
    return {**env, "TOKENIZERS_PARALLELISM": "false", **({"PYTHONPATH": str(site)} if site else {})}


def unpack(bundle: Path, into: Path) -> Path:
    """Extract with tarfile's 'data' filter: no member outside ``into``, no links out, no devices or FIFOs.

    The bundle must be a regular file (a FIFO would block); a truncated gzip ends in EOFError or a
    zlib error rather than a TarError, and both are a damaged bundle, not a bug.
    """
    import zlib

    from compress.io import require_regular_file

    require_regular_file(bundle, "make one with `compress bundle`")
    try:
        with tarfile.open(bundle) as tar:
            tar.extractall(into, filter="data")
    except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CompressError(
            f"{bundle}: not a readable bundle ({reason}); copy it again or make one with `compress bundle`"
        ) from None
    folders = [p for p in into.iterdir() if (p / "runner.py").is_file()]
    if len(folders) != 1:
        raise CompressError(
            f"{bundle}: expected one folder with runner.py inside; make it with `compress bundle`"
        )
    return folders[0]


def run_env(root: Path, site: Path, folder: Path, data: Path, timeout: float) -> dict[str, Any]:
    """The bundle's runner under emulation: which interpreter it found, then its predictions for ``data``."""
    env, out = emulated_env(site, folder), folder / f"arm-{site.name}.jsonl"
    start = time.time()
    info = subprocess.run(emulate(root, ["runner.py", "info"]), cwd=folder, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if info.returncode != 0:
        return {"error": (info.stderr.strip().splitlines() or ["no output"])[-1]}
    try:
        described = json.loads(info.stdout)
        result = {
            "interpreter": described["interpreter"],
            "machine": described["device"]["machine"],
            "model": described["model"],
            "model_sha256": described["model_sha256"],
        }
    except (ValueError, KeyError, TypeError) as exc:
        return {"error": f"runner.py info printed no usable JSON ({type(exc).__name__})"}
    command = emulate(root, ["runner.py", "predict", "--file", str(data), "--out", str(out)])
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        return {**result, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    try:
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    except (OSError, ValueError) as exc:
        return {**result, "error": f"{out.name}: no usable predictions ({type(exc).__name__})"}
    return {**result, "rows": rows, "seconds": round(time.time() - start, 1)}


def compare(host: list[dict[str, Any]], arm: list[dict[str, Any]], tie_margin: float = 0.0) -> dict[str, Any]:
    """Label agreement; a differing label is a near tie when the host's logits for the two labels are
    within ``tie_margin`` (different int8 kernels in two interpreter versions can flip those)."""
    differ = [i for i, (h, a) in enumerate(zip(host, arm, strict=True), 1) if h["label"] != a["label"]]
    diff = np.abs(np.array([h["logits"] for h in host]) - np.array([a["logits"] for a in arm])).max()
    margins = {}
    for line in differ:
        logits = host[line - 1]["logits"]
        ranked = sorted(logits, reverse=True)
        margins[line] = ranked[0] - ranked[1] if len(ranked) > 1 else float("inf")
    near_ties = [line for line in differ if margins[line] <= tie_margin]
    return {
        "agree": len(host) - len(differ),
        "total": len(host),
        "near_ties": len(near_ties),
        "max_abs_logit_diff": round(float(diff), 6),
        "differing_lines": differ,
        "host_margins": {str(line): round(margins[line], 4) for line in differ},
    }


def run_passes(run: dict[str, Any], total: int, min_agreement: float = 1.0) -> bool:
    """An emulated run passes when it scored every text and its labels match the host's (near ties
    counted as matches) on at least ``min_agreement`` of them."""
    if run.get("total") != total:
        return False
    return run["agree"] + run["near_ties"] >= math.ceil(min_agreement * total - 1e-9)


def host_predictions(
    bundle: Path, folder: Path, runner: Any, texts: list[str], pairs: list[str] | None
) -> dict[str, dict[str, Any]]:
    """The host's labels and logits from every model in the bundle: its primary ``model.<format>``, then
    each fallback, each loaded by name (``load(..., model=...)``) and run by the host's interpreter, keyed
    by its path relative to the folder as the emulated runs report theirs, so each emulated interpreter is
    compared on the model it picks. ``runner`` (the already verified load) gives the manifest."""
    from compress.runtime.runner import RunnerError, load

    manifest = runner.manifest
    models = [f"model.{manifest['format']}", *(entry["path"] for entry in manifest.get("fallbacks", []))]
    host = {}
    for model in dict.fromkeys(models):
        try:
            chosen = load(folder, verify=False, model=model)
            logits = chosen.predict_logits(texts, pairs)
        except RunnerError as exc:
            raise CompressError(f"{bundle}: {exc}") from None
        rows = [
            {**row, "logits": list(map(float, values))}
            for row, values in zip(chosen.decode(logits), logits, strict=True)
        ]
        host[model] = {"rows": rows, "sha256": chosen.describe()["model_sha256"]}
    return host


def model_contracts(manifest: dict[str, Any]) -> dict[str, Any]:
    """Each model's runtime contract as the bundle's manifest states it (TFLite: ops and op versions)."""
    models = {"model." + manifest["format"]: manifest.get("runtime")}
    models.update({entry["path"]: entry.get("runtime") for entry in manifest.get("fallbacks", [])})
    return {path: {"ops": (contract or {}).get("ops")} for path, contract in models.items()}


def verification_record(result: dict[str, Any]) -> dict[str, Any]:
    """What a passing verify-arm proves: these interpreter versions loaded these model files on emulated
    aarch64 and gave the host's labels. Only the versions run are named; no other version is claimed.
    The bundle's sha256 is the one hashed before it was unpacked (``result['bundle_sha256']``)."""
    models: dict[str, Any] = {path: {**entry, "verified": []} for path, entry in result["models"].items()}
    for run in result["runs"]:
        models[run["model"]]["sha256"] = run["model_sha256"]
        models[run["model"]]["verified"].append(
            {
                "interpreter": run["interpreter"]["name"],
                "version": run["interpreter"]["version"],
                "machine": run["machine"],
                "requirements": run["requirements"],
                "agree": run["agree"],
                "near_ties": run["near_ties"],
                "total": run["total"],
            }
        )
    return {
        "schema": VERIFICATION_SCHEMA,
        "bundle": Path(result["bundle"]).name,
        "bundle_sha256": result["bundle_sha256"],
        "artifact": result["artifact"],
        "emulator": {k: v for k, v in result["emulator"].items() if k != "root"},
        "min_agreement": result["min_agreement"],
        "tie_margin": result["tie_margin"],
        "models": models,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def record_path(bundle: Path) -> Path:
    return bundle.with_name(bundle.name + ".verified.json")


def remove_verification(bundle: Path) -> None:
    """Delete ``<bundle>.verified.json`` left by an earlier run; verify-arm does this before any work, so
    a run that fails at any point leaves no record that no longer describes the latest verification."""
    if not bundle.name:  # "/" or ".": not a bundle file; the bundle check says so
        return
    path = record_path(bundle)
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise CompressError(
            f"{path}: cannot remove the earlier verification record ({exc.strerror or type(exc).__name__}); "
            "delete it by hand and run verify-arm again"
        ) from None


def write_verification(bundle: Path, result: dict[str, Any]) -> Path | None:
    """On a pass, write ``<bundle>.verified.json``; on a failure remove one left by an earlier pass, so
    a record beside a bundle always describes the latest verification of those bytes."""
    from compress.io import write_json_atomic

    if not result["ok"]:
        remove_verification(bundle)
        return None
    path = record_path(bundle)
    write_json_atomic(path, verification_record(result))
    return path


def bundle_sha256(bundle: Path) -> str:
    """The bundle's sha256, taken before it is unpacked: the bytes the verification is about."""
    from compress.io import require_regular_file, sha256_file

    require_regular_file(bundle, "make one with `compress bundle`")  # a FIFO would block the hash
    try:
        return sha256_file(bundle)
    except OSError as exc:
        raise CompressError(
            f"{bundle}: not a readable bundle ({exc.strerror or type(exc).__name__}); "
            "copy it again or make one with `compress bundle`"
        ) from None


def verify_arm(
    bundle: str | Path,
    texts: list[str],
    pairs: list[str] | None = None,
    *,
    root_cache: str | Path | None = None,
    timeout: float = 3600,
    tie_margin: float = 0.0,
    min_agreement: float = 1.0,
) -> dict[str, Any]:
    """Run ``bundle`` emulated once per requirements file in it; compare its labels with the host's."""
    from compress.runtime.runner import RunnerError, load

    bundle = Path(bundle)
    sha256 = bundle_sha256(bundle)
    with tempfile.TemporaryDirectory(prefix="compress-arm-") as scratch:
        folder = unpack(bundle, Path(scratch))  # the bundle is checked before the emulated root is built
        try:
            runner = load(folder)
        except RunnerError as exc:
            raise CompressError(f"{bundle}: {exc}") from None
        check_tools()  # a missing qemu is said before the host spends minutes predicting
        host = host_predictions(bundle, folder, runner, texts, pairs)
        root = build_root(Path(root_cache) if root_cache else default_cache())
        data = folder / "verify-texts.jsonl"
        rows = [
            {"text": t} if pairs is None else {"text": t, "pair": p}
            for t, p in zip(texts, pairs or texts, strict=True)
        ]
        data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        requirements = sorted(folder.glob("requirements*.txt"))
        sites = [install_env(root, r) for r in requirements]  # pip, one environment at a time

        def emulated(pair: tuple[Path, Path]) -> dict[str, Any]:
            log.info("%s: emulated aarch64 with %s", bundle.name, pair[0].name)
            return run_env(root, pair[1], folder, data, timeout)

        # each emulated interpreter keeps about one core busy: run them side by side
        workers = max(1, min(len(sites), os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(emulated, zip(requirements, sites, strict=True)))
        runs = []
        for req, result in zip(requirements, results, strict=True):
            rows = result.pop("rows", None)
            reference = host.get(result.get("model"))
            if rows and reference is None:
                result["error"] = (
                    f"the runner picked {result.get('model')!r}, a model the bundle does not list"
                )
            runs.append(
                {
                    "requirements": req.name,
                    **result,
                    **(compare(reference["rows"], rows, tie_margin) if rows and reference else {}),
                }
            )
        return {
            "bundle": str(bundle),
            "bundle_sha256": sha256,
            "bundle_bytes": bundle.stat().st_size,
            "artifact": runner.manifest.get("name"),
            "format": runner.manifest["format"],
            "precision": runner.manifest.get("precision"),
            "host": {
                "interpreter": runner.describe()["interpreter"],
                "models": {path: {"sha256": h["sha256"]} for path, h in host.items()},
            },
            "models": model_contracts(runner.manifest),
            "emulator": {"qemu_cpu": CPU, "debian": SUITE, "root": str(root)},
            "runs": runs,
            "tie_margin": tie_margin,
            "min_agreement": min_agreement,
            "ok": bool(runs) and all(run_passes(r, len(texts), min_agreement) for r in runs),
        }
