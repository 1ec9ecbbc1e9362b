"""What reaches the terminal: errors once on stderr, long reports in the log file only."""

from __future__ import annotations

import logging
import sys

#: records for the run's log file, not the console
file_log = logging.getLogger("volseg.file_only")


def report_error(message: str, prefix: str = "error: ") -> None:
    """``message`` once on stderr (``error: ...``), and in the run's log file."""
    file_log.error("%s", message)
    sys.stderr.flush()
    sys.stdout.flush()
    print(f"{prefix}{message}", file=sys.stderr, flush=True)


#: third-party log lines that advertise or repeat what the run says itself (message prefixes)
QUIET_PREFIXES = (
    "💡 Tip:",  # Lightning's litlogger / litmodels advertisements
    "Trainer already configured with model summary callbacks",  # callbacks.model_summary is ours
)


def _keep(record: logging.LogRecord) -> bool:
    return not str(record.getMessage()).startswith(QUIET_PREFIXES)


def quiet_third_party() -> None:
    """Drop Lightning's tips (:data:`QUIET_PREFIXES`) from the console and the log."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_keep)  # once: addFilter skips one it holds
