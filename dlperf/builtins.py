"""Where the built-in models and hardware live: inside the wheel (dlperf/_data) or the repository's top level."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path:
    """`kind` is 'models' or 'hardware'. A wheel ships them under dlperf/_data; a checkout has them at top."""
    packaged = _PACKAGE / "_data" / kind
    if packaged.is_dir():
        return packaged
    return _PACKAGE.parent / kind


def builtin_names(kind: str) -> list[str]:
    return sorted(p.stem for p in data_dir(kind).glob("*.yaml"))


def resolve(name_or_path: str, kind: str) -> Path:
    """A name resolves to a built-in; anything with a path separator or ending in .yaml (or .json, a Hugging Face
    config) is a file."""
    text = str(name_or_path)
    if "/" in text or "\\" in text or text.endswith((".yaml", ".yml", ".json")):
        return Path(text)
    return data_dir(kind) / f"{text}.yaml"


def is_builtin(name: str, kind: str) -> bool:
    return (data_dir(kind) / f"{name}.yaml").is_file()
