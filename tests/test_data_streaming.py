"""Plain text streams from disk (issue 15, item 1): token files hold exactly the encoded text,
memory does not grow with the corpus, and DDP ranks train disjoint shares of each epoch.
(A SIGKILLed run on streamed text resumes exactly: tests/test_resume.py.)"""
from __future__ import annotations

import json
import pickle
import random
import sys

import numpy as np
import pytest
import torch

from conftest import DEBUG_YAML, run_process
from data_modules import TextFolderDataModule
from data_modules.batch import SpecialIds
from data_modules.token_files import TokenChunks

WORDS = ("we the people of the united states in order to form a more perfect union establish justice "
         "insure domestic tranquility provide for the common defence promote the general welfare").split()


def _lines(n: int, seed: int, words=(4, 14)) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) for _ in range(n)]


def _folder(path, train_lines: list[str], val_lines: list[str]):
    path.mkdir(parents=True, exist_ok=True)
    (path / "train.txt").write_text("\n".join(train_lines) + "\n", encoding="utf-8")
    (path / "val.txt").write_text("\n".join(val_lines) + "\n", encoding="utf-8")
    return path


def test_the_token_file_is_the_encoded_lines_joined_by_eos_and_chunks_are_its_slices(tmp_path):
    train = _lines(300, 0)
    folder = _folder(tmp_path / "corpus", train[:150] + ["", "   "] + train[150:], _lines(40, 1))  # blanks skipped
    dm = TextFolderDataModule(data_dir=str(folder), seq_len=16, prompt_len=4, vocab_size=300,
                              cache_dir=str(tmp_path / "cache"))
    chunks = dm.examples("train")
    assert isinstance(chunks, TokenChunks)
    stream = []
    for ids in dm.tokenizer.encode_batch(train):  # the hand-built stream
        stream += ([SpecialIds().eos] if stream else []) + ids
    on_disk = np.memmap(chunks.path, dtype=chunks.dtype, mode="r")  # nanoGPT's reader opens it as is
    assert on_disk.tolist() == stream
    assert len(chunks) == len(stream) // 16
    for i in (0, 7, len(chunks) - 1):
        example = chunks[i]
        assert example.source + example.target == stream[16 * i : 16 * i + 16]
        assert len(example.source) == 4
    assert chunks[0].source_text.split("\n")[0] in train[0]
    view = chunks[3:6]
    assert len(view) == 3 and view[0] == chunks[3] and list(view)[-1] == chunks[5]
    assert dm.example_lengths("train") == {(4, 12)}
    clone = pickle.loads(pickle.dumps(chunks))  # what a DataLoader worker receives: a path, reopened
    assert clone._fd is None and clone[5] == chunks[5]


def test_token_files_are_cached_by_tokenizer_and_data(tmp_path):
    folder = _folder(tmp_path / "corpus", _lines(200, 0), _lines(40, 1))
    first = TextFolderDataModule(data_dir=str(folder), seq_len=16, vocab_size=300, cache_dir=str(tmp_path / "cache"))
    path = first.examples("train").path
    stamp = path.stat().st_mtime_ns
    again = TextFolderDataModule(data_dir=str(folder), seq_len=32, vocab_size=300, cache_dir=str(tmp_path / "cache"))
    assert again.examples("train").path == path and path.stat().st_mtime_ns == stamp  # read, not rewritten
    assert len(again.examples("train")) == first.examples("train").n_tokens // 32
    other_vocab = TextFolderDataModule(data_dir=str(folder), seq_len=16, vocab_size=320, cache_dir=str(tmp_path / "cache"))
    assert other_vocab.examples("train").path != path
    (folder / "train.txt").write_text("\n".join(_lines(200, 5)) + "\n", encoding="utf-8")
    edited = TextFolderDataModule(data_dir=str(folder), seq_len=16, vocab_size=300, cache_dir=str(tmp_path / "cache"))
    assert edited.examples("train").path != path


def test_two_ranks_shares_are_disjoint_and_together_the_epoch(monkeypatch):
    import data_modules.batching as batching

    n = 101
    shares = []
    for rank in (0, 1):
        monkeypatch.setattr(batching, "distributed_world", lambda rank=rank: (2, rank))
        sampler = batching.EpochRandomSampler(range(n), seed=7)
        sampler.set_epoch(3)
        shares.append(list(sampler))
        assert len(sampler) == len(shares[-1]) == n // 2
    assert not set(shares[0]) & set(shares[1])
    assert len(set(shares[0]) | set(shares[1])) == n - 1  # the odd one out of this epoch's order is dropped
    monkeypatch.setattr(batching, "distributed_world", lambda: (1, 0))
    one = batching.EpochRandomSampler(range(n), seed=7)
    one.set_epoch(3)  # one process: exactly the shuffle every earlier run drew
    assert list(one) == torch.randperm(n, generator=torch.Generator().manual_seed(7 + 3)).tolist()


RECORDER = '''
import json, lightning as L
class RecordTargets(L.Callback):
    """Writes every training batch's target rows, one file per rank."""
    def __init__(self, folder: str):
        self.folder, self.rows = folder, []
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.rows += batch["target"].tolist()
    def on_train_end(self, trainer, module):
        with open(f"{self.folder}/rank{trainer.global_rank}.json", "w") as f:
            json.dump(self.rows, f)
'''


def test_ddp_ranks_train_disjoint_chunks_whose_union_is_the_epoch(tmp_path):
    """Two real gloo processes, one epoch of streamed text with an odd number of chunks: each
    chunk is trained by one rank at most, and all but the one the deal drops are trained."""
    folder = _folder(tmp_path / "corpus", _lines(120, 0), _lines(30, 1))
    (tmp_path / "recorder.py").write_text(RECORDER)
    data = ["--data", "data_modules.TextFolderDataModule", "--data.init_args.data_dir", folder,
            "--data.init_args.seq_len", "16", "--data.init_args.vocab_size", "300",
            "--data.init_args.cache_dir", tmp_path / "cache", "--data.init_args.batch_size", "4"]
    dm = TextFolderDataModule(data_dir=str(folder), seq_len=16, vocab_size=300, cache_dir=str(tmp_path / "cache"))
    chunks = [e.target for e in dm.examples("train")]
    if len(chunks) % 2 == 0:  # make the count odd, so a padding repeat would show
        (folder / "train.txt").write_text("\n".join(_lines(120, 0) + ["we the people"] * 4) + "\n", encoding="utf-8")
        dm = TextFolderDataModule(data_dir=str(folder), seq_len=16, vocab_size=300, cache_dir=str(tmp_path / "cache"))
        chunks = [e.target for e in dm.examples("train")]
    assert len(chunks) % 2 == 1 and len({tuple(c) for c in chunks}) == len(chunks)
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}"}
    result = run_process(
        ["fit", "--config", DEBUG_YAML, *data, "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp",
         "--trainer.devices", "2", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1.0",
         "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.callbacks+=recorder.RecordTargets", f"--trainer.callbacks.folder={tmp_path}",
         "--model.init_args.eval_every_n_epochs", "0", "--run.root", tmp_path / "runs", "--run.wandb", "disabled"],
        cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [{tuple(row) for row in json.loads((tmp_path / f"rank{r}.json").read_text())} for r in (0, 1)]
    assert len(seen[0]) == len(seen[1]) == len(chunks) // 2
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] <= {tuple(c) for c in chunks}


# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec from the parent (pytest).
RSS_WRAPPER = """
import re, sys
from attnlab.cli.main import main
code = main(sys.argv[2:])
with open("/proc/self/status") as f, open(sys.argv[1], "w") as out:
    out.write(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1))
sys.exit(code)
"""
PREPARE = """
import sys
from data_modules import TextFolderDataModule
TextFolderDataModule(data_dir=sys.argv[1], seq_len=64, vocab_size=300, cache_dir=sys.argv[2]).splits
"""
BUDGET_MB = 8  # what peak RSS may differ by between the two corpora
LARGE_MB = 10  # 5x the small one; its token lists in memory would add ~220 MB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc/self/status")
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path):
    """Training on a 10 MB corpus peaks within BUDGET_MB of training on a 2 MB one (token lists
    in memory would add ~220 MB). Tokenizer and token files are made first, in another
    process, so the runs measure training."""
    import subprocess

    val = _lines(60, 1)
    peaks = {}
    for mb in (2, LARGE_MB):
        rng, lines, size = random.Random(mb), [], 0
        while size < mb * 1_000_000:
            lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))))
            size += len(lines[-1]) + 1
        folder = _folder(tmp_path / f"corpus{mb}", lines, val)
        del lines
        made = subprocess.run([sys.executable, "-c", PREPARE, str(folder), str(tmp_path / "cache")],
                              capture_output=True, text=True, timeout=300)  # its own process: sentencepiece's memory
        assert made.returncode == 0, made.stderr[-3000:]
        out = tmp_path / f"rss{mb}"
        result = subprocess.run(
            [sys.executable, "-c", RSS_WRAPPER, str(out), "fit", "--config", str(DEBUG_YAML),
             "--data", "data_modules.TextFolderDataModule", "--data.init_args.data_dir", str(folder),
             "--data.init_args.seq_len", "64", "--data.init_args.vocab_size", "300",
             "--data.init_args.cache_dir", str(tmp_path / "cache"), "--trainer.max_steps", "20",
             "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
             "--run.root", str(tmp_path / "runs"), "--run.wandb", "disabled"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        peaks[mb] = int(out.read_text()) / 1024
    small, large = peaks.values()
    assert abs(large - small) < BUDGET_MB, f"peak RSS {small:.0f} MB on 2 MB of text, {large:.0f} MB on {LARGE_MB} MB"
