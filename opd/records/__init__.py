"""Records: the format (`format`), its rules (`rules`), reading and writing (`io`), the viewer
(`viewer`) and a command line (`python -m opd.records check|view FILE`)."""

from opd.records.format import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, MASKED_LOGPROB, Sequence
from opd.records.io import GroupWriter, read_groups, recover, to_jsonable
from opd.records.rules import RULES, check_group, is_valid

__all__ = [
    "DISTILL_PAD_ID", "DISTILL_PAD_LOGPROB", "MASK", "MASKED_LOGPROB", "RULES", "GroupWriter", "Sequence",
    "check_group", "is_valid", "read_groups", "recover", "to_jsonable",
]
