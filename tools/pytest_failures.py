"""A pytest plugin for runs on a lent device, whose time limit can stop pytest before its summary: each failure is
written to the file `FASTDECODE_FAILURES` names the moment it is reported (with xdist too: the reports reach the
controller), its test id and the end of its traceback.

    FASTDECODE_FAILURES=OUT/failures.txt python -m pytest -p tools.pytest_failures tests
"""

from __future__ import annotations

import os
from typing import Any


def pytest_runtest_logreport(report: Any) -> None:
    path = os.environ.get("FASTDECODE_FAILURES")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # an xdist worker: its controller gets the same report and writes it
        return
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext[-1500:]}\n")
