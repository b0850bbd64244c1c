"""`mlxd pull` of a Hugging Face repo id or a GGUF URL, against a local stand-in for the hub
(tests/models/hub_stand_in.py) reached through HF_ENDPOINT, so huggingface_hub's real
download code runs: an MLX repo kept as it is, a GGUF converted on arrival, an interrupted
download continued (not restarted) by the next pull, a hash mismatch refused leaving
nothing behind, and the choice of one GGUF among several."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest
from gguf import GGMLQuantizationType as Q
from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE as HF_CHUNK
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.utils import load_model
from tokenizers import Tokenizer, models, pre_tokenizers

from models.pull import PullError, choose_gguf
from router.cli import main
from tests.models import hub_stand_in
from tests.models.hub_stand_in import HubStandIn, sha256
from tests.models.test_gguf import write_tiny_gguf

REPO_ROOT = Path(__file__).resolve().parents[2]
MLX_REPO = "mlx-community/tiny-llama-4bit"
GGUF_REPO = "someone/tiny-llama-GGUF"
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 256,
              "tie_word_embeddings": True, "max_position_embeddings": 256}


@pytest.fixture(scope="session")
def mlx_repo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A tiny random llama, 4-bit quantized, in an MLX repo's layout (with the files a repo
    also holds that a pull leaves out)."""
    directory = tmp_path_factory.mktemp("mlx-repo")
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(TINY_LLAMA))
    nn.quantize(model, group_size=64, bits=4)
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, TINY_LLAMA["vocab_size"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    config = {**TINY_LLAMA, "architectures": ["LlamaForCausalLM"],
              "quantization": {"group_size": 64, "bits": 4}}
    return {
        "config.json": json.dumps(config).encode(),
        "model.safetensors": (directory / "model.safetensors").read_bytes(),
        "tokenizer.json": tokenizer.to_str().encode(),
        "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                             "eos_token": "<eos>"}).encode(),
        "README.md": b"# tiny llama\n",
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
    }


@pytest.fixture(scope="session")
def gguf_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    directory = tmp_path_factory.mktemp("gguf")
    return {f"tiny-llama-{q.name}.gguf": write_tiny_gguf(directory / f"{q.name}.gguf", "llama", q).read_bytes()
            for q in (Q.Q4_0, Q.Q8_0)}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    state = HubStandIn()
    server = hub_stand_in.start(state)
    monkeypatch.setenv("HF_ENDPOINT", state.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield state
    server.shutdown()
    server.server_close()


def pull(home: Path, *args: str) -> int:
    return main(["pull", *args, "--home", str(home)])


def test_a_repo_id_pulls_an_mlx_repo_that_models_list_shows(
    hub: HubStandIn, mlx_repo_files: dict[str, bytes], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    hub.add_repo(MLX_REPO, mlx_repo_files)
    home = tmp_path / "home"

    assert pull(home, MLX_REPO) == 0
    out, err = capfd.readouterr()
    model = home / "models" / "tiny-llama-4bit"  # the repo's name
    assert out.strip() == str(model.resolve())
    assert "download" in err and "100%" in err  # the progress bar, on stderr
    assert sorted(p.name for p in model.iterdir()) == [
        ".mlxd-pull.json", "config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json"]  # no README.md, no .gitattributes: not files a model needs
    assert (model / "model.safetensors").read_bytes() == mlx_repo_files["model.safetensors"]
    load_model(model)  # an MLX model as the repo had it
    fetched = sum(len(data) for name, data in mlx_repo_files.items() if (model / name).exists())
    assert sum(hub.bytes_sent.values()) == fetched  # each file once
    assert [p.name for p in (home / "models").iterdir()] == ["tiny-llama-4bit"]  # no staging left

    listing = subprocess.run([sys.executable, "-m", "router", "models", "list", "--home", str(home), "--json"],
                             cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60)
    (entry,) = json.loads(listing.stdout)["models"]
    assert entry["name"] == "tiny-llama-4bit" and entry["kind"] == "chat"
    assert entry["quantization"] == "4-bit g64" and entry["source"] == f"{MLX_REPO}@main"
    assert entry["loaded"] is None  # no service answers for this home: unknown, not an error

    assert pull(home, MLX_REPO) == 0  # a second pull finds it done
    assert sum(hub.bytes_sent.values()) == fetched


@pytest.fixture(scope="session")
def big_gguf(gguf_files: dict[str, bytes]) -> bytes:
    """A GGUF over two of huggingface_hub's download chunks (it writes a file a whole chunk at
    a time, so only a cut after the first chunk leaves bytes on disk to continue from): the
    tiny one with zeros after its tensors, which readers ignore."""
    data = gguf_files["tiny-llama-Q8_0.gguf"]
    return data + bytes(5 * HF_CHUNK // 2 - len(data))


@pytest.mark.parametrize("source", ["repo", "url"])
def test_an_interrupted_pull_continues_where_it_stopped(
    hub: HubStandIn, big_gguf: bytes, tmp_path: Path, source: str, capfd: pytest.CaptureFixture[str]
) -> None:
    if source == "repo":
        hub.add_repo(GGUF_REPO, {"tiny-llama-Q8_0.gguf": big_gguf})
        path, args = f"/cdn/{sha256(big_gguf)}", [GGUF_REPO]
    else:
        url = hub.add_file("tiny-llama-Q8_0.gguf", big_gguf)
        path, args = "/files/tiny-llama-Q8_0.gguf", [url, "--sha256", sha256(big_gguf)]
    home = tmp_path / "home"
    cut = 3 * HF_CHUNK // 2
    hub.cut(path, cut)  # the connection drops mid-file, and the server stays down

    assert pull(home, *args) == 1
    staged = home / "models" / ".pull-tiny-llama-Q8_0"
    kept = (staged / "tiny-llama-Q8_0.gguf.part").stat().st_size
    assert 0 < kept <= cut  # kept for the next run
    assert not (home / "models" / "tiny-llama-Q8_0").exists()
    assert "the same pull continues from there" in capfd.readouterr().err  # says how to go on

    hub.heal()
    assert pull(home, *args) == 0
    assert (path, f"bytes={kept}-") in hub.ranges  # continued with a Range request...
    assert hub.sent(path) == cut + len(big_gguf) - kept < 2 * len(big_gguf)  # ...not started over
    assert (home / "models" / "tiny-llama-Q8_0" / "config.json").is_file()
    assert not staged.exists()


def test_a_file_that_does_not_match_its_published_sha256_is_refused(
    hub: HubStandIn, mlx_repo_files: dict[str, bytes], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    hub.add_repo(MLX_REPO, mlx_repo_files)
    data = mlx_repo_files["model.safetensors"]
    hub.tamper(sha256(data), data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes
    home = tmp_path / "home"

    assert pull(home, MLX_REPO) == 1
    err = capfd.readouterr().err
    assert f"expected {sha256(data)}" in err and "refusing" in err
    assert list((home / "models").iterdir()) == []  # nothing half-made, nothing to resume from


def test_a_gguf_url_is_converted_on_arrival(
    hub: HubStandIn, gguf_files: dict[str, bytes], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    data = gguf_files["tiny-llama-Q8_0.gguf"]
    url = hub.add_file("tiny-llama-Q8_0.gguf", data)
    home = tmp_path / "home"

    assert pull(home, url, "--sha256", "0" * 64) == 1  # a wrong expected hash
    assert "expected " + "0" * 64 in capfd.readouterr().err
    assert list((home / "models").iterdir()) == []

    assert pull(home, url) == 0  # no hash published: the size is checked, the sha256 printed
    out, err = capfd.readouterr()
    model = Path(out.strip())
    assert model == (home / "models" / "tiny-llama-Q8_0").resolve()
    assert sha256(data) in err
    config = json.loads((model / "config.json").read_text())
    assert config["model_type"] == "llama" and config["quantization"]["bits"] == 8
    assert json.loads((model / ".mlxd-pull.json").read_text())["source"] == url
    load_model(model)


def test_a_gguf_repo_pull_converts_the_preferred_file_only(
    hub: HubStandIn, gguf_files: dict[str, bytes], tmp_path: Path
) -> None:
    hub.add_repo(GGUF_REPO, {**gguf_files, "README.md": b"two quantizations\n"})
    home = tmp_path / "home"

    assert pull(home, GGUF_REPO, "--as", "tiny") == 0
    assert hub.sent(f"/cdn/{sha256(gguf_files['tiny-llama-Q8_0.gguf'])}") > 0
    assert hub.sent(f"/cdn/{sha256(gguf_files['tiny-llama-Q4_0.gguf'])}") == 0
    marker = json.loads((home / "models" / "tiny" / ".mlxd-pull.json").read_text())
    assert marker["gguf"] == "tiny-llama-Q8_0.gguf" and marker["source"] == f"{GGUF_REPO}@main"

    assert pull(home, GGUF_REPO, "--file", "tiny-llama-Q4_0.gguf", "--as", "tiny") == 1  # the name is taken
    assert pull(home, GGUF_REPO, "--file", "tiny-llama-Q4_0.gguf") == 0
    assert (home / "models" / "tiny-llama-Q4_0" / "config.json").is_file()


def test_a_file_in_the_hugging_face_cache_is_not_downloaded_again(
    hub: HubStandIn, mlx_repo_files: dict[str, bytes], tmp_path: Path
) -> None:
    repo = hub.add_repo(MLX_REPO, mlx_repo_files)
    weights = f"/cdn/{sha256(mlx_repo_files['model.safetensors'])}"
    download = "import sys, huggingface_hub as h; h.hf_hub_download(sys.argv[1], 'model.safetensors')"
    subprocess.run([sys.executable, "-c", download, MLX_REPO],
                   check=True, capture_output=True, timeout=60)  # another tool's download, into HF_HOME
    assert hub.sent(weights) == len(mlx_repo_files["model.safetensors"])

    assert pull(tmp_path / "home", f"{MLX_REPO}@{repo.commit}") == 0
    assert hub.sent(weights) == len(mlx_repo_files["model.safetensors"])  # not again
    model = tmp_path / "home" / "models" / "tiny-llama-4bit"
    assert (model / "model.safetensors").read_bytes() == mlx_repo_files["model.safetensors"]


def test_unknown_repos_and_bad_sources_are_refused_with_the_reason(
    hub: HubStandIn, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    assert pull(home, "nobody/nothing") == 1
    assert "nobody/nothing" in capfd.readouterr().err
    assert pull(home, f"{hub.endpoint}/files/model.safetensors") == 1
    assert "a URL must name a .gguf file" in capfd.readouterr().err
    assert pull(home, "smollm2-135m", "--file", "x.gguf") == 2  # a catalog name takes no --file
    assert "--file" in capfd.readouterr().err


@pytest.mark.parametrize(("names", "wanted", "chosen"), [
    (["a-Q4_0.gguf", "a-Q4_K_M.gguf", "a-Q8_0.gguf"], None, "a-Q4_K_M.gguf"),
    (["a-q4_0.gguf", "a-q8_0.gguf", "README.md"], None, "a-q8_0.gguf"),
    (["only-F16.gguf", "mmproj-F16.gguf"], None, "only-F16.gguf"),  # a vision projector is no model
    (["a-Q4_K_M-00001-of-00002.gguf", "a-Q4_K_M-00002-of-00002.gguf", "a-Q8_0.gguf"], None, "a-Q8_0.gguf"),
    (["a-Q4_0.gguf", "a-Q8_0.gguf"], "a-Q4_0.gguf", "a-Q4_0.gguf"),
])
def test_the_gguf_chosen_from_a_repo(names: list[str], wanted: str | None, chosen: str) -> None:
    assert choose_gguf(names, wanted, "r") == chosen


@pytest.mark.parametrize(("names", "wanted", "message"), [
    (["a-Q4_0.gguf", "a-Q5_1.gguf"], None, "choose one with --file: a-Q4_0.gguf, a-Q5_1.gguf"),
    (["model.bin", "README.md"], None, "neither an MLX model"),
    (["a-Q8_0.gguf"], "a-Q4_0.gguf", "has no file 'a-Q4_0.gguf'"),
    (["a-00001-of-00002.gguf", "a-00002-of-00002.gguf"], "a-00001-of-00002.gguf", "one whole .gguf"),
])
def test_a_gguf_that_cannot_be_chosen_is_explained(names: list[str], wanted: str | None, message: str) -> None:
    with pytest.raises(PullError, match=re.escape(message)):
        choose_gguf(names, wanted, "r")
