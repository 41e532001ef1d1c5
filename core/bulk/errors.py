"""The bulk job's error: the job cannot run as asked (core/bulk/job.py, core/bulk/workfolder.py)."""

from __future__ import annotations

from core.errors import TesseraError


class JobError(TesseraError):
    """The job cannot run as asked (a model or option that does not fit, a work folder of another job or in
    use, an output that would replace the input)."""

    status, type, code = 400, "invalid_request_error", "bulk_job"
