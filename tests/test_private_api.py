"""Every private name of another library attnlab uses (attnlab.compat.private_api.USED) still
exists and still does what it is used for, in the installed Lightning / sacreBLEU; and nothing
private of another library is reached outside attnlab.compat (found by parsing the code, not by
looking for the listed names)."""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from sacrebleu.metrics import CHRF

import attnlab
from attnlab.compat import private_api as private
from attnlab.errors import AttnlabError


def _csv_logger(tmp_path):
    return CSVLogger(tmp_path, name="x", version="v")


def _wandb_logger(tmp_path):
    return WandbLogger(save_dir=str(tmp_path), offline=True, mode="disabled")


# (class, name) -> a check that the name exists on a fresh instance and does what attnlab assumes
CHECKS = {
    ("CSVLogger", "_experiment"): lambda tmp: private.get(_csv_logger(tmp), "_experiment") is None,  # made lazily
    ("CSVLogger", "_fs"): lambda tmp: hasattr(private.get(_csv_logger(tmp), "_fs"), "makedirs"),
    ("ExperimentWriter", "_check_log_dir_exists"): lambda tmp: any(  # called by the writer's __init__
        "self._check_log_dir_exists()" in inspect.getsource(c.__init__) for c in ExperimentWriter.__mro__
        if "__init__" in vars(c) and c.__module__.startswith("lightning")),
    ("ExperimentWriter", "_record_new_keys"): lambda tmp: callable(private.get(ExperimentWriter(str(tmp)), "_record_new_keys")),
    ("WandbLogger", "_experiment"): lambda tmp: private.get(_wandb_logger(tmp), "_experiment") is None,
    ("WandbLogger", "_offline"): lambda tmp: private.get(_wandb_logger(tmp), "_offline") is True,
    ("WandbLogger", "_wandb_init"): lambda tmp: private.get(_wandb_logger(tmp), "_wandb_init").get("mode") == "disabled",
    ("_ChildProcessObserver", "_run"): lambda tmp: "self._run()" in inspect.getsource(_ChildProcessObserver.run),
    # LastCheckpoint saves last.ckpt where ModelCheckpoint's own hooks save, as they save it
    ("ModelCheckpoint", "_should_save_on_train_epoch_end"): lambda tmp: (
        "self._should_save_on_train_epoch_end(trainer)" in inspect.getsource(ModelCheckpoint.on_train_epoch_end)
        and "not self._should_save_on_train_epoch_end(trainer)" in inspect.getsource(ModelCheckpoint.on_validation_end)
        and private.get(ModelCheckpoint(save_on_train_epoch_end=True), "_should_save_on_train_epoch_end")(None) is True),
    ("ModelCheckpoint", "_save_last_checkpoint"): lambda tmp: (
        list(inspect.signature(private.get(ModelCheckpoint(), "_save_last_checkpoint")).parameters)
        == ["trainer", "monitor_candidates"]
        and "self._save_last_checkpoint(trainer, monitor_candidates)" in inspect.getsource(ModelCheckpoint)),
    ("ModelCheckpoint", "_monitor_candidates"): lambda tmp: _monitor_candidates_of_a_stub_trainer() == {"epoch": 3, "step": 7},
    # Lightning's signal connector decides on SLURM's requeue from this connector's environment
    ("Trainer", "_accelerator_connector"): lambda tmp: (
        "self.trainer._accelerator_connector.cluster_environment" in inspect.getsource(_SignalConnector.register_signal_handlers)
        and private.get(_slurm_trainer(), "_accelerator_connector").cluster_environment.auto_requeue is True),
    ("CHRF", "_extract_corpus_statistics"): lambda tmp: _summed_statistics_score_the_corpus(),
    ("CHRF", "_compute_score_from_stats"): lambda tmp: _summed_statistics_score_the_corpus(),
}


def _slurm_trainer():
    """A one-device Trainer given a SLURM environment: its strategy has none, the connector does."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    trainer = Trainer(accelerator="cpu", devices=1, plugins=[SLURMEnvironment()], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    assert getattr(trainer.strategy, "cluster_environment", None) is None
    return trainer


def _monitor_candidates_of_a_stub_trainer() -> dict:
    trainer = SimpleNamespace(callback_metrics={}, current_epoch=3, global_step=7)
    return {k: int(v) for k, v in private.get(ModelCheckpoint(), "_monitor_candidates")(trainer).items()}


def _summed_statistics_score_the_corpus() -> bool:
    """attnlab.families.metrics.ChrF sums per-sentence statistics (so DDP ranks add up exactly), and
    the seed-level test (attnlab.reports.significance.score) sums them over a seed's examples:
    both scores must be sacreBLEU's public corpus chrF of those sentences."""
    hypotheses, references = ["the cat sat on the mat", "", "a dog"], ["the cat is on the mat", "nothing", "a dog"]
    chrf = CHRF()
    stats = private.get(chrf, "_extract_corpus_statistics")(hypotheses, [references])
    score = private.get(chrf, "_compute_score_from_stats")
    summed = [sum(column) for column in zip(*stats)]
    counts = (2, 0, 1)  # a resample: the first sentence twice, the second not at all
    resampled = [float(sum(k * x for k, x in zip(counts, column))) for column in zip(*stats)]
    repeated = [i for i, k in enumerate(counts) for _ in range(k)]
    return (len(stats) == 3 and score(summed).score == pytest.approx(CHRF().corpus_score(hypotheses, [references]).score)
            and score(resampled).score == pytest.approx(CHRF().corpus_score(
                [hypotheses[i] for i in repeated], [[references[i] for i in repeated]]).score))


def test_every_listed_name_has_a_check():
    assert set(CHECKS) == set(private.USED)


@pytest.mark.parametrize("entry", sorted(private.USED), ids=lambda e: ".".join(e))
def test_the_name_still_exists_and_means_the_same(entry, tmp_path):
    assert CHECKS[entry](tmp_path), f"lightning {private.lightning_version()} changed {'.'.join(entry)}"


def test_an_unlisted_private_name_is_refused():
    with pytest.raises(AssertionError, match="not listed"):
        private.get(CSVLogger("."), "_name")


def test_a_name_an_upgrade_removed_is_one_clear_error():
    class Renamed(CSVLogger):
        def __getattribute__(self, name):
            if name == "_fs":
                raise AttributeError(name)
            return super().__getattribute__(name)

    with pytest.raises(AttnlabError, match=r"has no Renamed\._fs.*install lightning"):
        private.get(Renamed("."), "_fs")


# ---- the scan: every private attribute another library's object is reached by ----------------------
# Not a list of known names (it could then only find those): every `x._name` (single underscore)
# outside compat/ is parsed out and must be attnlab's own. Rules:
# - `self._x` / `cls._x` / `super()._x` in an attnlab class: `_x` is defined or assigned by an attnlab
#   class in its MRO (in a mixin: anywhere in attnlab), and no Lightning / torch / other library's
#   class in that MRO has `_x` (an inherited private method or attribute, read or clobbered);
# - `obj._x` on anything else: `_x` is a name attnlab defines (a class's, or a module's), and no
#   library class that attnlab subclasses has it;
# - getattr / setattr / hasattr / delattr with a literal private name count as `obj._x`;
# - an attnlab class may override a library's private method only when USED lists it;
# - no import of another package's private module or name.

OWN_PACKAGES = ("attnlab", "data_modules")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(cls: type) -> bool:
    return cls.__module__.split(".")[0] in OWN_PACKAGES


def _defined(node: ast.ClassDef) -> set[str]:
    """Private names a class body defines, or that its methods assign as self._x / cls._x."""
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    for item in ast.walk(node):
        if (isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store)
                and isinstance(item.value, ast.Name) and item.value.id in ("self", "cls")):
            names.add(item.attr)
    return {n for n in names if _private(n)}


@functools.lru_cache(maxsize=None)
def _source(cls: type) -> str:
    try:
        return textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # a builtin or C type: only its vars() tell
        return ""


@functools.lru_cache(maxsize=None)
def _own_defines(cls: type) -> frozenset[str]:
    source = _source(cls)
    tree = ast.parse(source) if source else None
    body = {n for n in vars(cls) if _private(n)}
    return frozenset(body | (_defined(tree.body[0]) if tree and isinstance(tree.body[0], ast.ClassDef) else set()))


@functools.lru_cache(maxsize=None)
def _library_names(cls: type) -> frozenset[str]:
    """The private names a library class defines or touches: its own vars and every self._x /
    "_x" in its source (instance attributes set in __init__ included)."""
    found = {n for n in vars(cls) if _private(n)}
    found |= set(re.findall(r"(?:\bself\.|\bcls\.|[\"'])(_[A-Za-z0-9]\w*)\b", _source(cls)))
    return frozenset(n for n in found if _private(n))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, qualname: str | None):
    if qualname is None:
        return None
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - not importable here: judged from the source alone
        return None
    return obj if isinstance(obj, type) else None


PACKAGE = Path(attnlab.__file__).parent
SCANNED = sorted(p for p in PACKAGE.rglob("*.py") if "compat" not in p.relative_to(PACKAGE).parts)


@functools.lru_cache(maxsize=1)
def _package_index():
    """(private names attnlab defines anywhere, private names of the library classes it subclasses)."""
    own, library = set(), set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    own |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                own |= {a.asname for a in node.names if a.asname}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                own |= _defined(node)
        for qualname in _class_qualnames(tree):
            cls = _resolve(_module_name(path), qualname)
            for base in (cls.__mro__ if cls else ()):
                if not _own(base):
                    library |= _library_names(base)
    return {n for n in own if _private(n)}, library


def _class_qualnames(tree: ast.Module):
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield prefix + child.name
                yield from walk(child, prefix + child.name + ".")
    yield from walk(tree, "")


def _private_reaches(path: Path) -> list[str]:
    """Every private access in one attnlab file that the rules above refuse, as `file:line: why`."""
    own_names, library_names = _package_index()
    module = _module_name(path)
    where = path.relative_to(PACKAGE)
    found = []

    def judge(node, base, name: str, classes: list) -> None:
        is_self = (isinstance(base, ast.Name) and base.id in ("self", "cls")) or (
            isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super")
        text = f"{where}:{node.lineno}: {ast.unparse(node)}"
        if is_self and classes:
            node_cls, qualname = classes[-1]
            cls = _resolve(module, qualname)
            if cls is None:
                if name not in _defined(node_cls):
                    found.append(f"{text}: {name} is not defined by {node_cls.name}")
                return
            library = [c for c in cls.__mro__ if not _own(c) and name in _library_names(c)]
            if library:
                found.append(f"{text}: {name} belongs to {library[0].__module__}.{library[0].__qualname__}")
            elif not any(name in _own_defines(c) for c in cls.__mro__ if _own(c)) and (
                    name not in own_names or name in library_names):  # a mixin's: defined by the class it joins
                found.append(f"{text}: no attnlab class of {cls.__name__}'s MRO defines {name}")
        elif name not in own_names or name in library_names:
            found.append(f"{text}: {name} is not attnlab's own")

    def visit(node, classes: list, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner, nested = classes, in_function
            if isinstance(child, ast.ClassDef):  # one inside a function cannot be imported: qualname None
                outer = classes[-1][1] if classes else ""
                qualname = None if in_function or outer is None else f"{outer}.{child.name}".lstrip(".")
                inner, nested = [*classes, (child, qualname)], False
                overrides(child, qualname)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                nested = True
            if isinstance(child, ast.Attribute) and _private(child.attr):
                judge(child, child.value, child.attr, classes)
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name)
                  and child.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(child.args) >= 2
                  and isinstance(child.args[1], ast.Constant) and isinstance(child.args[1].value, str)
                  and _private(child.args[1].value)):
                judge(child, child.args[0], child.args[1].value, classes)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                imports(child)
            visit(child, inner, nested)

    def overrides(node: ast.ClassDef, qualname) -> None:
        cls = _resolve(module, qualname)
        if cls is None:
            return
        for item in node.body:
            names = [item.name] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            for name in filter(_private, names):
                library = [c for c in cls.__mro__[1:] if not _own(c) and name in _library_names(c)]
                if library and not any((c.__name__, name) in private.USED for c in cls.__mro__[1:] if not _own(c)):
                    found.append(f"{where}:{item.lineno}: {node.name}.{name} overrides "
                                 f"{library[0].__module__}.{library[0].__qualname__}.{name}, not listed in USED")

    def imports(node) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level or not node.module or node.module.split(".")[0] in OWN_PACKAGES:
                return
            parts = node.module.split(".") + [a.name for a in node.names]
        else:
            parts = [p for a in node.names if a.name.split(".")[0] not in OWN_PACKAGES for p in a.name.split(".")]
        if any(_private(p) for p in parts):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}: a private module or name")

    visit(ast.parse(path.read_text(encoding="utf-8")), [], False)
    return found


def test_nothing_outside_the_compat_module_reaches_into_another_library_privately():
    """Private attributes of other libraries' objects are reached only through private_api.get/put."""
    offenders = [line for path in SCANNED for line in _private_reaches(path)]
    assert not offenders, "\n".join(offenders)
