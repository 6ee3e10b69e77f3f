"""The model summary at the start of `fit`, without Lightning's "Total Flops" line.

Lightning counts FLOPs only through a module's `example_input_array`, which no family has (they
take the shared batch, not one tensor), so its summary always ends in "0 Total Flops": a number
that is wrong. The real count per step is `train/tflops` (attnlab.training.mfu).
"""
from __future__ import annotations

import logging

from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count

log = logging.getLogger("lightning.pytorch.callbacks.model_summary")


class ParameterSummary(ModelSummary):
    """Lightning's table of modules and parameter counts, and the totals that are true."""

    @staticmethod
    def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops=0, **summarize_kwargs) -> None:
        columns = [(header, [str(v) for v in values]) for header, values in summary_data if header != "FLOPs"]
        widths = [max([len(header), *map(len, values)]) for header, values in columns]
        rows = [" | ".join(h.ljust(w) for (h, _), w in zip(columns, widths))]
        rule = "-" * len(rows[0])
        for i in range(len(columns[0][1]) if columns else 0):
            rows.append(" | ".join(values[i].ljust(w) for (_, values), w in zip(columns, widths)))
        totals = [
            (get_human_readable_count(trainable_parameters), "Trainable params"),
            (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
            (get_human_readable_count(total_parameters), "Total params"),
            (get_formatted_model_size(model_size), "Total estimated model params size (MB)"),
        ]
        lines = [rows[0], rule, *rows[1:], rule, *(f"{value:<10} {label}" for value, label in totals)]
        log.info("\n" + "\n".join(lines))
