"""Put a report on the dashboard: one wandb run (job type `report`) in the sweep's group."""
from __future__ import annotations

from pathlib import Path

from attnlab.loggers.run_loggers import (
    quiet_wandb_settings,
    resolve_wandb_mode,
    wandb_credentials_present,
)


def log_report(folder: Path, output: Path, headers: list[str], rows: list[dict], plots: list[Path], mode: str) -> str | None:
    """Log the table and plots; returns a line saying where they went (offline without credentials)."""
    import wandb

    mode = resolve_wandb_mode(mode)
    if mode == "online" and not wandb_credentials_present():
        mode = "offline"
    if mode == "disabled":
        return None
    run = wandb.init(project="attnlab", group=folder.name, job_type="report", name=f"report/{folder.name}",
                     dir=str(output), mode=mode, settings=quiet_wandb_settings())
    table = wandb.Table(columns=headers, data=table_cells(headers, rows))
    run.log({"report/table": table, **{f"report/{p.stem}": wandb.Image(str(p)) for p in plots}})
    where = Path(run.dir).parent
    url = run.url if mode == "online" else None
    run.finish()
    return f"wandb: {url}" if url else f"wandb (offline): {where}; upload with `wandb sync {where}`"


def table_cells(headers: list[str], rows: list[dict]) -> list[list]:
    """The rows as cells a wandb.Table accepts: it fixes each column's type from its first cell,
    so a column that mixes numbers with text (a run without a value shows "—") becomes text."""
    cells = [[_plain(row[h]) for h in headers] for row in rows]
    for j in range(len(headers)):
        if not all(r[j] is None or isinstance(r[j], (int, float)) for r in cells):
            for r in cells:
                r[j] = None if r[j] is None else str(r[j])
    return cells


def _plain(value):
    return value if isinstance(value, (int, float, str)) or value is None else str(value)
