"""The house: what the package root holds, the family contract, and module paths of earlier releases."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import attnlab
from attnlab.families import FAMILIES, FamilyModule

PACKAGE = Path(attnlab.__file__).parent


def test_the_package_root_holds_only_its_face_the_entry_point_and_the_errors():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py", "errors.py"]


def layout_paths(text: str) -> set[str]:
    """The file paths the tree of docs/guides/layout.md names: a line's leading names (`x/` a
    folder, `y.py` a file, several on one line) sit under the nearest less-indented folder."""
    block = text.split("```", 2)[1]
    paths, folders = set(), []  # folders: (indent, name) from the root down
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        names = []
        for word in line.split():
            if not re.fullmatch(r"[\w./]+/|[\w.]+\.py", word):
                break
            names.append(word)
        if not names:
            continue
        folders = [(i, f) for i, f in folders if i < indent]
        where = "".join(f for _, f in folders)
        paths |= {where + n for n in names if n.endswith(".py")}
        folders += [(indent, n) for n in names if n.endswith("/")][:1]
    return paths


def test_the_docs_layout_names_every_file_of_both_packages_by_its_path():
    """By path, not base name: three families each have a decoder_only.py (families/, models/,
    generation/), and a file named under the wrong folder, or one that is gone, fails."""
    root = PACKAGE.parents[1]
    named = layout_paths((root / "docs" / "guides" / "layout.md").read_text(encoding="utf-8"))
    every = {str(p.relative_to(root)) for folder in (PACKAGE, root / "data_modules") for p in folder.rglob("*.py")}
    files = {p for p in every if not p.endswith("__init__.py")}
    assert len(files) > 90
    assert not files - named, f"files docs/guides/layout.md does not name: {sorted(files - named)}"
    gone = {p for p in named if p.startswith(("platform/", "data_modules/"))} - every
    assert not gone, f"docs/guides/layout.md names files that do not exist: {sorted(gone)}"


def test_the_layout_reader_places_a_file_under_its_folder():
    text = "```\na/   one\n  b.py c.py   two\n  d/\n    b.py   three\n  e.py\nf.py\n```"
    assert layout_paths(text) == {"a/b.py", "a/c.py", "a/d/b.py", "a/e.py", "f.py"}


def test_data_modules_is_the_base_and_imports_nothing_from_attnlab():
    """The two packages do not import each other in a circle: attnlab builds on data_modules."""
    import ast

    import data_modules.errors
    from attnlab import errors

    offenders, files = [], sorted((PACKAGE.parents[1] / "data_modules").rglob("*.py"))
    assert len(files) > 10
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "attnlab"]
    assert not offenders
    assert errors.ConfigError is data_modules.errors.ConfigError and errors.DataError is data_modules.errors.DataError


def test_no_fsdp1_internals_are_imported_anywhere():
    pattern = re.compile(r"torch\.distributed\.fsdp\._|_flat_param|_runtime_utils|_get_full_state_dict_context")
    offenders = [str(p) for p in PACKAGE.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))]
    assert not offenders


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_implements_the_whole_contract(name):
    cls = FAMILIES[name]
    assert not getattr(cls, "__abstractmethods__", None), cls.__abstractmethods__
    assert issubclass(cls, FamilyModule) and cls.family == name


def test_a_family_that_leaves_out_part_of_the_contract_cannot_be_built():
    class Incomplete(FamilyModule):
        family = "incomplete"

        def loss_terms(self, batch):
            raise AssertionError

    assert {"generate_ids", "positions_needed", "attention_stacks", "attention_weights"} <= Incomplete.__abstractmethods__
    with pytest.raises(TypeError, match="abstract"):
        Incomplete(vocab_size=10)


@pytest.mark.parametrize("old,new,name", [
    ("attnlab.modules", "attnlab.families", "DecoderOnly"),
    ("attnlab.averaging", "attnlab.checkpoints.averaging", "CheckpointAveraging"),
    ("attnlab.experiment.attention_maps", "attnlab.probes.attention_maps", "AttentionMaps"),
])
def test_module_paths_of_earlier_releases_still_resolve(old, new, name):
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


def test_a_config_naming_an_old_class_path_still_builds(tmp_path):
    from attnlab.cli.lightning_cli import AttnlabCLI
    from conftest import EXPERIMENTS

    config = (EXPERIMENTS / "debug.yaml").read_text(encoding="utf-8").replace("attnlab.DecoderOnly", "attnlab.modules.DecoderOnly")
    assert "attnlab.modules.DecoderOnly" in config
    path = tmp_path / "old.yaml"
    path.write_text(config, encoding="utf-8")
    cli = AttnlabCLI(args=["--config", str(path), "--run.root", str(tmp_path), "--run.wandb", "disabled",
                           "--trainer.callbacks+=attnlab.averaging.CheckpointAveraging"], run=False)
    assert type(cli.model).__name__ == "DecoderOnly"
    assert any(type(c).__name__ == "CheckpointAveraging" for c in cli.trainer.callbacks)


def test_reading_the_errors_imports_no_torch_and_the_cli_knows_every_data_module():
    """Every attnlab command reads the error types before any work (a refusal costs no torch
    import); the CLI then imports every data module and every family, so short class names
    (`--data GrammarDataModule`, `--model DecoderOnly`) resolve as they did when data_modules and
    attnlab.families loaded eagerly."""
    import subprocess
    import sys

    families = [f"attnlab.families.{name}" for name in ("decoder_only", "encoder_decoder", "block_diffusion")]
    code = ("import sys; import attnlab.errors; light = 'torch' not in sys.modules; "
            "import attnlab.cli.lightning_cli; print(light, 'data_modules.grammar.task' in sys.modules, "
            f"all(name in sys.modules for name in {families!r}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["True", "True", "True"], result.stderr[-2000:]


def module_imports(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Every attnlab module -> the attnlab modules it imports, at any depth of its code (a lazy
    import inside a function is still an edge: it only moves the circle to run time)."""
    import ast

    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in names.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module
                          for a in node.names}
        graph[name] = {e for e in edges if e in names and e != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of a directed graph, one path each (depth-first search, back edges)."""
    circles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return circles


def test_no_module_of_the_package_imports_itself_back_through_others():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    graph = module_imports()
    assert len(graph) > 100 and "attnlab.sweeps.tune" in graph["attnlab.sweeps.spec"]
    assert not import_circles(graph), import_circles(graph)
