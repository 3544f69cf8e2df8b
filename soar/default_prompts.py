"""The default prompt texts the schema's fields start from (``soar.config``): the paper's teacher prompt
and student template (``teacher.prompt``, ``data.prompt_template``) and the coach's prompt of context
distillation (``distill.coach_prompt``). A preset or an override replaces them.
"""

PAPER_TEACHER_PROMPT = (
    "You are generating a new math problem for a math assistant.\n"
    "Allowed topics: Algebra, Counting and Probability, Geometry, Intermediate Algebra, Number Theory, "
    "Prealgebra, or Precalculus.\n"
    "Output rules (follow EXACTLY):\n"
    "- Provide the final formatted problem in this structure: <question>[full math question]<question>"
    "<answer>\\boxed{[answer]}</answer>\n"
    "- Any explanations, steps, or reasoning about the problem goes OUTSIDE the <question> and <answer> tags.\n"
    "Constraints:\n"
    "- The problem must be original, challenging, and require at least 2--3 steps of reasoning.\n"
    "- Output exactly ONE problem. You MUST follow the specified format EXACTLY.\n"
    "Begin now:\n"
)
"""The paper's teacher prompt (§2), verbatim, including its ``<question>`` closing-tag typo in the
instructions (``soar.teachers.parse`` accepts both closers)."""

PAPER_STUDENT_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves "
    "it. The assistant first shows the complete reasoning process step by step, then provides the "
    "final answer in \\boxed{}. The assistant must always follow the format: 'User: [question] "
    "Assistant: [detailed reasoning] The final answer is: \\boxed{[answer]}.\n\n"
    'User: {question} Assistant: "'
)


COACH_PROMPT = (
    "You are a coach for a student who solves math problems. Read the problem, the student's answer and its "
    "grade. Write one short piece of advice that would help the student solve problems like this one: a "
    "method, a check or a pitfall, not this problem's answer.\n"
    "Problem: {question}\n"
    "Student's answer: {response}\n"
    "Grade: {grade}\n"
    "Write the advice between <advice> and </advice>.\n"
)
"""The coach prompt (``distill.coach_prompt``): slots ``{question}``, ``{response}`` (the policy's
completion; empty under ``distill.objective=sft``, where the coach advises before any attempt) and
``{grade}`` (``correct`` / ``incorrect`` / ``not attempted``). No ``{reference}``: the default coach never
sees the gold answer (``distill.coach_sees_reference``)."""
