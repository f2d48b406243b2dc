"""Records: the format (`format`), its rules (`rules`), reading with bounds (`reader`), writing
and recovery (`io`), what is escaped (`escape`), the viewer (`viewer`) and a command line
(`python -m opd.records check|view FILE`)."""

from opd.records.format import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, MASKED_LOGPROB, Sequence
from opd.records.io import GroupWriter, Recovered, recover, to_jsonable
from opd.records.reader import LIMITS, Limits, RecordFileError, read_groups
from opd.records.rules import RULES, check_group, is_valid

__all__ = [
    "DISTILL_PAD_ID", "DISTILL_PAD_LOGPROB", "LIMITS", "MASK", "MASKED_LOGPROB", "RULES", "GroupWriter", "Limits", "RecordFileError",
    "Recovered", "Sequence", "check_group", "is_valid", "read_groups", "recover", "to_jsonable",
]
