"""Graders of OpenAI's reinforcement fine-tuning: the reward of a model's reply.

A grader is OpenAI's JSON object (`string_check`, `text_similarity`, `python`, `score_model`,
`multi`), as `method.reinforcement.grader` of a job and `/v1/fine_tuning/alpha/graders/*` take
it; it reads the dataset row as `{{ item.* }}` and the reply as `{{ sample.* }}`:

    from eft.training.graders import grade, run, validate

    grader = {"type": "string_check", "name": "answer", "operation": "eq",
              "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}"}
    validate(grader, item={"answer": "Paris"})       # {"grader": {...}}, or GraderValidationError
    grade(grader, "Paris", {"answer": "Paris"}).score  # 1.0
    run(grader, "Lyon", {"answer": "Paris"})           # OpenAI's run response, "reward": 0.0

- `models.py`: the grader objects and their validation (`parse_grader`, `validate`);
- `templates.py`: `{{ namespace.path }}` references; `formula.py`: a multi grader's
  `calculate_output`; `similarity.py`: the text similarity metrics; `judging.py`: model graders
  (the judge model is called through a function the caller passes); `sandbox.py`: python graders'
  code, run in a limited child process;
- `scoring.py`: `grade`, `grade_many` (a batch; python graders run it in one process), `run` and
  `run_response` (OpenAI's `/graders/run` response).

Each module's docstring says what OpenAI documents and where this implementation differs. The
package imports nothing first-party outside `eft.training.graders`.
"""

from eft.training.graders.judging import SCORE_RESPONSE_FORMAT, Judge, JudgeRefusal, label_response_format
from eft.training.graders.models import Grader, GraderValidationError, parse_grader, validate
from eft.training.graders.sandbox import PythonOutcome, SandboxLimits, run_python_grader
from eft.training.graders.scoring import GradeError, GradeResult, grade, grade_many, run, run_response
from eft.training.graders.templates import make_sample

__all__ = [
    "SCORE_RESPONSE_FORMAT", "GradeError", "GradeResult", "Grader", "GraderValidationError", "Judge",
    "JudgeRefusal", "PythonOutcome", "SandboxLimits", "grade", "grade_many", "label_response_format",
    "make_sample", "parse_grader", "run", "run_python_grader", "run_response", "validate",
]
