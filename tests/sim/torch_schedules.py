"""Prints torch.distributed.pipelining's own schedules, the truth tests/sim/torch_schedule_test.cpp
compares pipetune's generators with.

Usage: torch_schedules.py NAME:RANKS:STAGES_PER_RANK:MICRO_BATCHES ...
For each request it prints "case NAME:RANKS:STAGES_PER_RANK:MICRO_BATCHES", then one line per rank
with the rank's pipeline_order as torch's compute-only CSV writes it (empty cells idle; compute
actions only), or "error MESSAGE" when torch refuses the combination.

Or: torch_schedules.py --validate FILE.csv:STAGES:MICRO_BATCHES ... reads each CSV as
_PipelineScheduleMulti._load_csv does and runs torch's _validate_schedule on it, printing
"case FILE" then "ok" or "error MESSAGE".
"""

import csv
import sys
from unittest import mock

from torch.distributed.pipelining import schedules
from torch.distributed.pipelining.stage import PipelineStage

CLASSES = {
    "gpipe": schedules.ScheduleGPipe,
    "1f1b": schedules.Schedule1F1B,
    "interleaved-1f1b": schedules.ScheduleInterleaved1F1B,
    "interleaved-zb": schedules.ScheduleInterleavedZeroBubble,
    "zbv": schedules.ScheduleZBVZeroBubble,
    "looped-bfs": schedules.ScheduleLoopedBFS,
    "dualpipev": schedules.ScheduleDualPipeV,
}
# DualPipeV's paired "(0F3;3B1)OVERLAP_F_B" is a compute action too.
COMPUTE = {"F", "B", "I", "W", "OVERLAP_F_B"}


def stand_in_stages(cls, ranks, per_rank):
    # The generators read only each stage's rank, group size and stage count.
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank = 0
    stage.group_size = ranks
    stage.submod = None
    stage.num_stages = ranks * per_rank
    if issubclass(cls, schedules.PipelineScheduleSingle):
        return stage
    return [stage for _ in range(per_rank)]


def rows(name, ranks, per_rank, micro_batches):
    cls = CLASSES[name]
    instance = cls(stand_in_stages(cls, ranks, per_rank), micro_batches)
    order = instance.pipeline_order
    out = []
    for rank in range(ranks):
        cells = []
        for action in order[rank]:
            # Single-stage schedules add REDUCE_GRAD markers; the compute-only form has none.
            if action is None:
                cells.append("")
            elif action.computation_type.value in COMPUTE:
                cells.append(str(action))
        out.append(",".join(cells))
    return out


def validate(request):
    path, stages, micro_batches = request.rsplit(":", 2)
    with open(path, newline="") as f:
        actions = {rank: [schedules._Action.from_str(c) for c in row]
                   for rank, row in enumerate(csv.reader(f))}
    schedules._validate_schedule(actions, len(actions), int(stages), int(micro_batches))


def main():
    if sys.argv[1:2] == ["--validate"]:
        for request in sys.argv[2:]:
            print(f"case {request}")
            try:
                validate(request)
                print("ok")
            except Exception as error:
                print("error " + (str(error).splitlines()[0] if str(error) else type(error).__name__))
        return
    for request in sys.argv[1:]:
        name, ranks, per_rank, micro_batches = request.split(":")
        print(f"case {request}")
        try:
            for line in rows(name, int(ranks), int(per_rank), int(micro_batches)):
                print(line)
        except Exception as error:  # torch refuses: the test expects us to refuse too
            print("error " + str(error).splitlines()[0] if str(error) else "error " + type(error).__name__)


if __name__ == "__main__":
    main()
