"""`mlxd models list` and `mlxd rm`: each model's size, kind and quantization read from its
files, "-" for loaded when no service answers and the service's state when one does; rm
removes a model, names what is on disk when asked for something else, and is refused while
the running service has the model loaded."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import httpx
import pytest

from router.cli import main
from tests.router.router_harness import MODEL_ID, RunningRouter


def write_safetensors(path: Path, tensors: dict[str, tuple[str, int]]) -> None:
    """A safetensors file of zeros: name -> (dtype, bytes)."""
    header, offset = {}, 0
    for name, (dtype, num_bytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": [num_bytes], "data_offsets": [offset, offset + num_bytes]}
        offset += num_bytes
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(offset))


def make_model(models_dir: Path, name: str, config: dict[str, object], *extra_files: str) -> Path:
    path = models_dir / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for file in extra_files:
        (path / file).write_text("{}")
    return path


def models_list(home: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, object]:
    assert main(["models", "list", "--json", "--home", str(home), *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_reads_kind_and_quantization_from_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models_dir = tmp_path / "home" / "models"
    quantized = make_model(models_dir, "coder-4bit", {"model_type": "qwen2",
                                                      "quantization": {"group_size": 64, "bits": 4}})
    write_safetensors(quantized / "model.safetensors", {"w": ("U32", 4096)})
    plain = make_model(models_dir, "chat-bf16", {"model_type": "llama"})
    write_safetensors(plain / "model.safetensors", {"w": ("BF16", 2048), "norm": ("F32", 256)})
    make_model(models_dir, "qwen3-embedding", {"model_type": "qwen3", "architectures": ["Qwen3Model"]},
               "modules.json")  # sentence-transformers: an embedding model whatever its architecture
    make_model(models_dir, "bge", {"model_type": "bert", "torch_dtype": "float32"})
    (models_dir / "loose.gguf").write_bytes(b"GGUF" + bytes(100))
    (models_dir / ".pull-half").mkdir()
    (models_dir / ".pull-half" / "model.safetensors.part").write_bytes(bytes(10))

    listing = models_list(tmp_path / "home", capsys)
    by_name = {m["name"]: m for m in listing["models"]}
    assert {n: (m["kind"], m["quantization"]) for n, m in by_name.items()} == {
        "coder-4bit": ("chat", "4-bit g64"),
        "chat-bf16": ("chat", "bfloat16"),  # the dtype of most of the weights' bytes
        "qwen3-embedding": ("embedding", "-"),
        "bge": ("embedding", "float32"),
        "loose": ("chat", "gguf"),
    }
    assert by_name["loose"]["size_bytes"] == 104
    assert by_name["coder-4bit"]["size_bytes"] == (quantized / "model.safetensors").stat().st_size + len(
        (quantized / "config.json").read_text())
    assert all(m["loaded"] is None for m in listing["models"]) and listing["service"] is None
    assert listing["unfinished_pulls"] == [{"name": "half", "path": str(models_dir / ".pull-half"),
                                            "size_bytes": 10}]

    assert main(["models", "list", "--home", str(tmp_path / "home")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "KIND", "QUANTIZATION", "LOADED", "SOURCE"]
    assert any(line.startswith("coder-4bit") and "4-bit g64" in line and line.split()[-2:] == ["-", "-"]
               for line in lines)
    assert any(line.startswith("unfinished pull: half") for line in lines)


def test_rm_removes_a_model_and_then_says_what_is_on_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    models_dir = home / "models"
    doomed = make_model(models_dir, "old", {"model_type": "llama"})
    make_model(models_dir, "kept", {"model_type": "llama"})
    (models_dir / ".pull-old").mkdir()  # an unfinished pull of the same name goes too

    assert main(["rm", "old", "--yes", "--home", str(home)]) == 0
    assert capsys.readouterr().out.split() == [str(doomed), str(models_dir / ".pull-old")]
    assert sorted(p.name for p in models_dir.iterdir()) == ["kept"]

    assert main(["rm", "old", "--yes", "--home", str(home)]) == 1
    assert f"no model 'old' in {models_dir}; on disk: kept" in capsys.readouterr().err
    assert main(["rm", "../home", "--yes", "--home", str(home)]) == 1  # names, not paths
    assert main(["rm", "kept", "--home", str(home)]) == 2  # no terminal to ask, no --yes
    assert "--yes" in capsys.readouterr().err and (models_dir / "kept").is_dir()


def test_rm_is_refused_while_the_service_has_the_model_loaded(
    router: RunningRouter, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = router.url.rsplit(":", 1)[1]
    flags = ["--model-dir", str(model_dir.parent), "--home", str(tmp_path / "cli-home"), "--port", port]
    with httpx.Client(base_url=router.url, timeout=20) as client:
        client.post(f"/admin/models/{MODEL_ID}/load").raise_for_status()

        (entry,) = models_list(tmp_path / "cli-home", capsys, *flags[:2], *flags[4:])["models"]
        assert entry["name"] == MODEL_ID and entry["loaded"] is True and entry["state"] in ("idle", "ready")

        assert main(["rm", MODEL_ID, "--yes", *flags]) == 1
        err = capsys.readouterr().err
        assert f"{MODEL_ID} is {entry['state']} in the service at {router.url}" in err and "unload" in err
        assert model_dir.is_dir()

        client.post(f"/admin/models/{MODEL_ID}/unload").raise_for_status()
        assert main(["rm", MODEL_ID, "--yes", *flags]) == 0
        assert not model_dir.exists()
