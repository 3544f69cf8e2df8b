"""The teacher side of SOAR (paper §1.2, §2): the teacher as an RLOO-trained policy.

- ``prompts``: the prompt and the (question, answer) completion format;
- ``parse``: a completion into a pair or a typed rejection;
- ``sampling``: rejection sampling until g*n completions parse, split into the g datasets;
- ``rewards``: the dataset rewards (grounded: students trained on each dataset, scored on Q_R;
  intrinsic variants);
- ``update``: ``TeacherPolicy``, sampling plus the set-level RLOO update (A_k over the g datasets).
"""

from soar.teachers.parse import Pair, Reject, parse_pair
from soar.teachers.prompts import PAPER_TEACHER_PROMPT, TeacherFormat, format_pair

__all__ = ["PAPER_TEACHER_PROMPT", "Pair", "Reject", "TeacherFormat", "format_pair", "parse_pair"]
