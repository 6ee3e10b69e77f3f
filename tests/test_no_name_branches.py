"""Capabilities, not names (issue 45): outside a family's own files no code branches on a family's
name, and outside components/positional.py none on a positional encoding's; they ask the class
(`autoregressive`, `count_flops`, `adds_score_bias`, ...). Read with ast, so a name in a message,
a docstring or an assignment (`family = "decoder_only"`) does not count; a comparison, a
membership test, a set of names, a dict keyed by names, an index or a match case does."""
from __future__ import annotations

import ast
from pathlib import Path

import attnlab
from attnlab.components.positional import REGISTRY as POSITIONAL
from attnlab.families import FAMILIES

PACKAGE = Path(attnlab.__file__).parent
DATA_MODULES = PACKAGE.parents[1] / "data_modules"
OWN_FOLDERS = ("families", "models", "generation")  # a family's own files: <folder>/<family name>.py
POSITIONAL_HOME = PACKAGE / "components" / "positional.py"
# Lazy-export tables name the classes `attnlab.<Name>` and `attnlab.families.<Name>` export.
FACES = (PACKAGE / "__init__.py", PACKAGE / "families" / "__init__.py")
# Also a plain word ("none" of significance tests, run ids): a positional name only where the
# other side of the comparison says it is about a positional encoding.
PLAIN_WORDS = {"none"}


def family_names() -> dict[str, str]:
    """Every registered family's name and class name -> the family's name."""
    names = {name: name for name in FAMILIES}
    names.update({cls.__name__: name for name, cls in FAMILIES.items()})
    return names


def _strings(node) -> list[str]:
    """The string constants of a node: itself, or the items of a tuple, list or set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for item in node.elts for s in _strings(item)]
    return []


def _patterns(pattern) -> list[str]:
    if isinstance(pattern, ast.MatchValue):
        return _strings(pattern.value)
    if isinstance(pattern, ast.MatchOr):
        return [s for p in pattern.patterns for s in _patterns(p)]
    if isinstance(pattern, ast.MatchAs) and pattern.pattern is not None:
        return _patterns(pattern.pattern)
    return []


def branch_strings(tree: ast.AST):
    """(line, strings, context) of every place a string can steer control flow; `context`: the
    source of what the strings are compared with or looked up in."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            yield (node.lineno, [s for o in operands for s in _strings(o)],
                   " ".join(ast.unparse(o) for o in operands if not _strings(o)))
        elif isinstance(node, ast.Set):  # a set of names exists for membership tests
            yield node.lineno, _strings(node), ""
        elif isinstance(node, ast.Dict):  # dispatch: {name: what to do}[name]
            yield node.lineno, [s for key in node.keys if key is not None for s in _strings(key)], ""
        elif isinstance(node, ast.Subscript):
            yield node.lineno, _strings(node.slice), ast.unparse(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "startswith", "endswith") and node.args:
            yield node.lineno, _strings(node.args[0]), ast.unparse(node.func.value)
        elif isinstance(node, ast.Match):
            subject = ast.unparse(node.subject)
            for case in node.cases:
                yield case.pattern.lineno, _patterns(case.pattern), subject


def name_branches(source: str, path: Path) -> list[str]:
    """`line: name` of each branch on a family or positional name that `path` may not take."""
    families, out = family_names(), []
    relative = path.relative_to(PACKAGE).parts if PACKAGE in path.parents else ()
    own_family = path.stem if len(relative) == 2 and relative[0] in OWN_FOLDERS else None
    for line, strings, context in branch_strings(ast.parse(source)):
        for s in strings:
            if s in families and families[s] != own_family and path not in FACES:
                out.append(f"{line}: family {s!r}")
            elif s in POSITIONAL and path != POSITIONAL_HOME and (s not in PLAIN_WORDS or "positional" in context):
                out.append(f"{line}: positional encoding {s!r}")
    return out


def test_the_scan_finds_each_kind_of_name_branch_and_passes_what_is_no_branch():
    """The scan against the branches this issue removed, and against look-alikes that are not."""
    caught = [
        'if module.family == "block_diffusion": pass',
        'if module.family not in ("decoder_only", "block_diffusion"): pass',
        'AR_FAMILIES = {"DecoderOnly", "EncoderDecoder"}',
        'cls = {"decoder_only": A, "encoder_decoder": B}[family]',
        'module = modules["decoder_only"]',
        'ok = cfg.positional != "alibi"',
        'ok = self.backbone.positional == "none"',
        'ok = class_path.endswith("BlockDiffusion")',
        'match family:\n    case "encoder_decoder": pass',
    ]
    elsewhere = PACKAGE / "reports" / "example.py"
    for source in caught:
        assert name_branches(source, elsewhere), source
    passed = [
        'family = "decoder_only"',
        'raise ConfigError(f"{path}: a decoder_only checkpoint, not alibi")',
        'def f():\n    """Compares with decoder_only; alibi."""',
        'if run_id and run_id != "none": pass',
        'kind = "none" if c.test == "none" else "examples"',
        'target = ("training", "decoder_only")',
        'bench(families=["decoder_only"], positional="learned")',
    ]
    for source in passed:
        assert not name_branches(source, elsewhere), source
    # A family's own files may name it, and positional.py its encodings; not each other's.
    assert not name_branches('if self.family == "block_diffusion": pass', PACKAGE / "models" / "block_diffusion.py")
    assert name_branches('if self.family == "decoder_only": pass', PACKAGE / "models" / "block_diffusion.py")
    assert name_branches('ok = cfg.positional != "alibi"', PACKAGE / "models" / "block_diffusion.py")
    assert not name_branches('REGISTRY = {"alibi": Alibi, "none": PositionalEncoding}', POSITIONAL_HOME)


def test_no_code_outside_its_own_files_branches_on_a_family_or_positional_name():
    files = sorted(PACKAGE.rglob("*.py")) + sorted(DATA_MODULES.rglob("*.py"))
    assert len(files) > 100
    offenders = [f"{path.relative_to(PACKAGE.parents[1])}:{where}"
                 for path in files for where in name_branches(path.read_text(encoding="utf-8"), path)]
    assert not offenders, "branches on a name (ask the class instead):\n" + "\n".join(offenders)


def test_the_positional_choices_are_the_registrys_and_a_bias_is_asked_of_the_class(monkeypatch):
    """An encoding added to positional.REGISTRY is a choice of `backbone.positional` with no
    other edit, and whether it adds a score bias (which keeps block diffusion off
    FlexAttention) is its own to say."""
    import pytest

    from attnlab.components import BackboneConfig, build_positional
    from attnlab.components.positional import Alibi, PositionalEncoding
    from attnlab.errors import ConfigError
    from attnlab.models.block_diffusion import BlockDiffusionModel

    class Biased(Alibi):
        """ALiBi under another name."""

    monkeypatch.setitem(POSITIONAL, "biased", Biased)
    cfg = BackboneConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, positional="biased")
    assert isinstance(build_positional(cfg), Biased)
    with pytest.raises(ConfigError, match="biased"):  # the refusal lists the live choices
        BackboneConfig(positional="nope")
    assert [name for name, cls in POSITIONAL.items() if cls.adds_score_bias] == ["alibi", "biased"]
    assert not PositionalEncoding.adds_score_bias
    model = BlockDiffusionModel(cfg, 11, pad_id=0, mask_id=1)
    cuda_tokens = type("Tokens", (), {"is_cuda": True})()  # _use_flex reads only where the tokens are
    assert not model._use_flex(cuda_tokens)
    plain = BlockDiffusionModel(BackboneConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0), 11, 0, 1)
    assert plain.eval()._use_flex(cuda_tokens)
