"""The students (paper §1.3-1.4): one student trained on a dataset (``soar.students.trainer``, on the
shared RLOO policy of ``soar.policy``); where an outer step's g*r students train (``soar.students.pool``:
in-process or a Ray pool; ``soar.students.lockstep``: shared-engine LoRA students;
``soar.students.stacked``: stacked students); promotion (``soar.students.promotion``)."""
