"""worker.text_encoder on the real all-MiniLM-L6-v2: its vectors equal a plain numpy BERT
forward written here from the same safetensors (no MLX in it), similar sentences are
closer than unrelated ones, a batch gives each row what it gives alone, and a
cross-encoder directory (BERT with a classification head) scores like its numpy forward."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from worker.text_encoder import TextEncoder

SENTENCES = ["The cat sits on the mat.", "A kitten is resting on a rug.",
             "Quarterly revenue grew by twelve percent.", "hello world"]


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def numpy_bert(weights: dict[str, np.ndarray], config: dict, ids: list[int],
               types: list[int] | None = None, prefix: str = "") -> np.ndarray:
    """HF BertModel's last hidden state for one unpadded sequence, in float64 numpy."""
    w = {k[len(prefix):]: v.astype(np.float64) for k, v in weights.items() if k.startswith(prefix)}
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]
    types = types or [0] * len(ids)
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:len(ids)]
         + w["embeddings.token_type_embeddings.weight"][types])
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def linear(t: np.ndarray, name: str) -> np.ndarray:
            return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        q, k, v = (linear(x, f"attention.self.{n}").reshape(len(ids), heads, -1).transpose(1, 0, 2)
                   for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attended = (scores / scores.sum(-1, keepdims=True)) @ v
        attended = attended.transpose(1, 0, 2).reshape(len(ids), -1)
        x = _layer_norm(x + linear(attended, "attention.output.dense"),
                        w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
        ffn = linear(_gelu(linear(x, "intermediate.dense")), "output.dense")
        x = _layer_norm(x + ffn, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
    return x


@pytest.fixture(scope="module")
def encoder(embedding_model_dir: Path) -> TextEncoder:
    return TextEncoder(embedding_model_dir, "embedding")


def test_matches_a_numpy_bert_forward(encoder: TextEncoder, embedding_model_dir: Path) -> None:
    weights = load_file(str(embedding_model_dir / "model.safetensors"))
    config = json.loads((embedding_model_dir / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(embedding_model_dir / "tokenizer.json"))
    tokenizer.no_padding()  # its tokenizer.json pads to 128 and truncates there
    tokenizer.no_truncation()
    assert tokenizer.encode("hello world").ids == [101, 7592, 2088, 102]  # BERT's uncased vocabulary
    assert (encoder.pooling.mode, encoder.pooling.normalize, encoder.max_tokens) == ("mean", True, 256)
    got = encoder.embed(encoder.tokenize(SENTENCES))
    for sentence, vector in zip(SENTENCES, got, strict=True):
        hidden = numpy_bert(weights, config, tokenizer.encode(sentence).ids)
        expected = hidden.mean(0)
        expected /= np.linalg.norm(expected)
        np.testing.assert_allclose(vector, expected, atol=1e-4)
    assert got.shape == (4, 384) and got.dtype == np.float32


def test_similar_sentences_are_closer(encoder: TextEncoder) -> None:
    cat, kitten, revenue, _ = encoder.embed(encoder.tokenize(SENTENCES))
    assert cat @ kitten > cat @ revenue + 0.3
    assert kitten @ cat > kitten @ revenue + 0.3


def test_a_batch_gives_each_row_what_it_gives_alone(encoder: TextEncoder) -> None:
    rows = encoder.tokenize([*SENTENCES, "a much longer sentence " * 12])
    together = encoder.embed(rows)
    for row, vector in zip(rows, together, strict=True):
        np.testing.assert_allclose(encoder.embed([row])[0], vector, atol=1e-5)


def test_token_ids_are_framed_and_truncation_keeps_the_window(encoder: TextEncoder) -> None:
    inner = encoder.tokenizer.encode("hello world", add_special_tokens=False).ids
    assert encoder.frame(inner) == [101, 7592, 2088, 102]
    long = encoder.tokenize(["word " * 400])[0]
    cut = encoder.truncate(long)
    assert len(long) > 256 and len(cut) == 256 and cut[0] == 101 and cut[-1] == 102


def test_a_cross_encoder_scores_like_its_numpy_forward(embedding_model_dir: Path, tmp_path: Path) -> None:
    """No cross-encoder ships on the index: one is built from MiniLM's encoder plus a
    random classification head, in HF's BertForSequenceClassification layout."""
    directory = tmp_path / "cross-encoder"
    directory.mkdir()
    shutil.copy(embedding_model_dir / "tokenizer.json", directory / "tokenizer.json")
    config = json.loads((embedding_model_dir / "config.json").read_text())
    config |= {"architectures": ["BertForSequenceClassification"], "num_labels": 1}
    (directory / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    weights = {f"bert.{k}": v for k, v in load_file(str(embedding_model_dir / "model.safetensors")).items()}
    weights["classifier.weight"] = rng.normal(0, 0.2, (1, 384)).astype(np.float32)
    weights["classifier.bias"] = np.zeros(1, np.float32)
    save_file(weights, str(directory / "model.safetensors"))
    encoder = TextEncoder(directory, "reranker")
    pairs = [encoder.pair("where do cats sleep", doc) for doc in SENTENCES[:3]]
    scores = encoder.score(pairs)
    for (ids, types), score in zip(pairs, scores, strict=True):
        hidden = numpy_bert(weights, config, ids, types, prefix="bert.")
        pooled = np.tanh(hidden[0] @ weights["bert.pooler.dense.weight"].T + weights["bert.pooler.dense.bias"])
        logit = pooled @ weights["classifier.weight"][0] + weights["classifier.bias"][0]
        assert score == pytest.approx(1 / (1 + math.exp(-logit)), abs=1e-4)


def test_a_decoder_llm_pools_its_last_token(default_model_dir: Path, tmp_path: Path) -> None:
    """A decoder LLM whose sentence-transformers config asks for last-token pooling (as
    Qwen3-Embedding's does): a tiny random llama with SmolLM2's tokenizer. Each text's
    vector is the final hidden state of its own last token, also in a right-padded batch."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from router.model_registry import model_kind
    from tests.worker.tiny_models import ARCHS, make_tiny

    tiny = make_tiny("llama", default_model_dir)
    directory = tmp_path / "tiny-embedder"
    (directory / "1_Pooling").mkdir(parents=True)
    config = {**ARCHS["llama"], "architectures": ["LlamaForCausalLM"]}
    (directory / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(tiny.model.parameters())))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir / name, directory / name)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False}))
    assert model_kind(config, directory) == "embedding" and model_kind(config) == "chat"
    encoder = TextEncoder(directory, "embedding")
    assert (encoder.pooling.mode, encoder.pooling.normalize, encoder.dimensions) == ("last", True, 64)
    rows = encoder.tokenize(SENTENCES)
    got = encoder.embed(rows)
    for row, vector in zip(rows, got, strict=True):
        hidden = np.array(tiny.model.model(mx.array([row]))[0, -1])
        np.testing.assert_allclose(vector, hidden / np.linalg.norm(hidden), atol=1e-5)
