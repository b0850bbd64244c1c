"""House rules that slid back when only a reviewer kept them, checked over the source (no
imports executed), next to tests/test_import_graph.py: each failing test names the files
that break its rule."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_import_graph import REPO, graph

# what a module outside router/api/ may import from it: the registry and its record type
# (every dialect is reached through them), the routes that are no dialect's, and the
# `mlxd` usage block every dialect's answer carries
API_DOORS = frozenset({"router.api", "router.api.registry", "router.api.dialect_entry", "router.api.health",
                       "router.api.models", "router.api.openai_format"})


def test_no_module_outside_the_api_imports_a_dialect() -> None:
    wrong = {module: sorted(i for i in imports if i.startswith("router.api.") and i not in API_DOORS)
             for module, imports in graph().items() if not module.startswith("router.api")}
    assert not {m: i for m, i in wrong.items() if i}, "import dialects through router.api.registry"


def test_the_app_mounts_every_dialect_route_from_the_registry() -> None:
    """A dialect's path written into app.py is a second table beside the registry."""
    source = (REPO / "router" / "app.py").read_text()
    spelled = re.findall(r'Route\("(/v\d/(?:chat|completions|messages|responses|embeddings|rerank)[^"]*)"', source)
    assert not spelled, f"router/app.py mounts dialect routes itself: {spelled}"


def code_words(path: Path) -> set[str]:
    """The identifiers and the non-docstring string constants of a module, lower-cased."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.add(node.id.lower())
        elif isinstance(node, ast.Attribute):
            words.add(node.attr.lower())
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.add(node.name.lower())
        elif isinstance(node, ast.alias):
            words.add(node.name.lower())
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.add(node.value.lower())
    return words


def test_no_middleware_knows_a_dialect() -> None:
    """The middlewares answer through http_errors.error_response_for, never by asking
    "is this Anthropic?" themselves (a docstring may say whom a header is for)."""
    middlewares = ("auth", "body_limit", "drain_gate", "startup_gate", "send_timeout", "request_id", "web_guard")
    for name in middlewares:
        named = sorted(w for w in code_words(REPO / "router" / "middleware" / f"{name}.py") if "anthropic" in w or "messages" in w)
        assert not named, f"router/{name}.py names a dialect in its code: {named}"


def python_files(*roots: str) -> list[Path]:
    return [p for root in roots for p in (REPO / root).rglob("*.py") if ".venv" not in p.parts]


CSRC = REPO / "worker" / "csrc"


def test_one_primitive_boilerplate_in_the_kernels() -> None:
    """Every CPU-only MLX primitive derives from worker/csrc/cpu_primitive.h, which alone
    refuses the GPU and allocates and registers the output: no eighth copy of it."""
    sources = {p.name: p.read_text() for p in CSRC.iterdir() if p.suffix in (".cpp", ".h", ".inc")}
    direct = sorted(n for n, s in sources.items() if re.search(r":\s*public\s+(mlx::core::)?Primitive\b", s)
                    and n != "cpu_primitive.h")
    assert not direct, f"derive from CpuPrimitive, not Primitive: {direct}"
    copies = sorted(n for n, s in sources.items() for marker in ("eval_gpu", "get_command_encoder", "allocator::malloc")
                    if marker in s and n != "cpu_primitive.h")
    assert not copies, f"the primitive boilerplate is written again in {copies}"


def test_one_word_for_the_quantized_panels() -> None:
    """The quantized kernels call the block of weight rows they unpack at once a panel;
    "tile" meant the same thing once (the attention kernel's register tile of query rows is
    another thing, and keeps its name)."""
    named = sorted(p.name for p in CSRC.glob("quantized*") if re.search(r"\btiles?\b|_tile|tile_", p.read_text(), re.I))
    named += sorted(p.name for p in (REPO / "worker").glob("*.py") if "quantiz" in p.name
                    and re.search(r"\btiles?\b", p.read_text(), re.I))
    assert not named, f"say panel, not tile: {named}"


def test_no_citation_of_a_document_the_repo_does_not_have() -> None:
    """A comment that sends the reader to DESIGN.md sends them nowhere: the repo has none
    (the design lives in docs/architecture.md and README.md)."""
    if (REPO / "DESIGN.md").exists():
        return
    roots = ("router", "worker", "kvstore", "protocol", "models", "bench", "deploy", "tests")
    files = [p for root in roots for p in (REPO / root).rglob("*") if p.is_file()
             and p.suffix in (".py", ".cpp", ".h", ".inc", ".sh", ".md", ".txt", ".toml")]
    files += [REPO / "Makefile", REPO / "README.md", REPO / "pyproject.toml"]
    citing = sorted(str(p.relative_to(REPO)) for p in files if p != Path(__file__) and "DESIGN.md" in p.read_text())
    assert not citing, f"these cite a DESIGN.md the repo does not have: {citing}"


OLD_NAMES = REPO / "router" / "old_names.py"  # the one module that spells the cold tier's old name


def ssd_spellings(path: Path) -> list[str]:
    """What in a module's code calls the cold tier "ssd": an identifier (name, attribute,
    function, class, argument, keyword, import, dataclass field) or an identifier-like
    string (a JSON key, a metric name, a label value) with an `ssd` part, or a `mlxd_ssd_`
    metric name anywhere in a string. Prose (docstrings, help texts, log lines) may say SSD."""
    tree = ast.parse(path.read_text(), str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.arg):
            names.append(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.append(node.arg)
        elif isinstance(node, ast.alias):
            names.extend(filter(None, (node.name.rsplit(".", 1)[-1], node.asname)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "mlxd_ssd_" in node.value or re.fullmatch(r"[a-z0-9_]+", node.value):
                names.append(node.value)
    return sorted({n for n in names if "mlxd_ssd_" in n or "ssd" in n.lower().split("_")})


def test_the_cold_tier_has_one_name_outside_the_old_names_table() -> None:
    """Identifiers and metrics say "cold" (`cold_tokens`, `in_cold_tier`, tier "cold",
    `mlxd_cold_tier_*`); the shipped "ssd" names live on as aliases in router/old_names.py
    only, until mlxd 0.2."""
    roots = ("router", "worker", "kvstore", "protocol", "models")
    found = {str(p.relative_to(REPO)): spelled for p in python_files(*roots)
             if p != OLD_NAMES and (spelled := ssd_spellings(p))}
    assert not found, f"say cold (old names go in router/old_names.py): {found}"


def test_the_ssd_guard_sees_each_kind_of_spelling(tmp_path: Path) -> None:
    """The guard above is not blind: each way of spelling the old name is caught, prose is not."""
    module = tmp_path / "m.py"
    for code in ("ssd_tokens = 1", "x.on_ssd", "def read_ssd(): pass", "class A:\n    ssd_blocks: int = 0",
                 "f(ssd_tokens=1)", "body = {'ssd_tokens': 1}", "tier = 'ssd'", "name = 'mlxd_ssd_restored_blocks'",
                 "help = 'blocks in mlxd_ssd_restored_blocks_total'"):
        module.write_text(code)
        assert ssd_spellings(module), code
    module.write_text('"""Blocks read from SSD."""\nlog.info("%d pending SSD writes", n)\ncold_tokens = 1\n')
    assert ssd_spellings(module) == []


MAX_MODULE_LINES = 400


def test_no_module_over_400_lines() -> None:
    """Small modules named for what they hold: a module past 400 lines holds two ideas."""
    roots = ("router", "worker", "kvstore", "protocol", "models")
    long = {str(p.relative_to(REPO)): n for p in python_files(*roots)
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these by what they hold: {long}"


def unreplayable_fuzzers(path: Path) -> list[str]:
    """The Hypothesis tests in `path` that neither derandomize nor take the session's seed:
    a failure of theirs in CI could not be run again from what CI printed."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if not any(d.startswith("given(") for d in decorators):
            continue
        seeded = "seed(FUZZ_SEED)" in decorators
        derandomized = any(d.startswith("settings(") and "derandomize=True" in d for d in decorators)
        if not (seeded or derandomized):
            shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
            found.append(f"{shown}::{node.name}")
    return found


def test_every_fuzzer_can_be_replayed_from_what_ci_printed() -> None:
    offenders = [name for path in python_files("tests") for name in unreplayable_fuzzers(path)]
    assert not offenders, f"add @seed(FUZZ_SEED) (tests/fuzz_seed.py) or derandomize=True: {offenders}"


def test_the_fuzzer_guard_sees_an_unseeded_fuzzer(tmp_path: Path) -> None:
    sample = tmp_path / "fuzzer.py"
    sample.write_text("@settings(max_examples=5)\n@given(x=st.integers())\ndef test_x(x):\n    pass\n")
    assert unreplayable_fuzzers(sample) == ["fuzzer.py::test_x"]
    sample.write_text("@seed(FUZZ_SEED)\n@given(x=st.integers())\ndef test_x(x):\n    pass\n")
    assert unreplayable_fuzzers(sample) == []
    sample.write_text("@settings(derandomize=True, max_examples=5)\n@given(x=st.integers())\ndef test_x(x):\n    pass\n")
    assert unreplayable_fuzzers(sample) == []
