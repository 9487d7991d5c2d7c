"""OpenAI's grader endpoints (`/v1/fine_tuning/alpha/graders/validate` and `/run`) through the
official `openai` package, on the app in-process: every grader type validates and runs as OpenAI
answers (the scores equal the graders' own computation), a grader at fault is a 422 naming the
field, a python grader that never ends is stopped and reported without holding the next run, and a
model grader's judge is a model of this service asked as the caller's tenant."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from eft.service.serving.engines import LocalModels
from eft.service.settings import get_settings
from eft.service.store.store import Store
from tests.helpers.app import bearer, new_key, service_app

ITEM = {"answer": "Paris", "reference": "The capital of France is Paris."}
CHECK = {"type": "string_check", "name": "exact", "operation": "eq", "input": "{{ sample.output_text }}",
         "reference": "{{ item.answer }}"}
SIMILAR = {"type": "text_similarity", "name": "close", "evaluation_metric": "fuzzy_match",
           "input": "{{ sample.output_text }}", "reference": "{{ item.reference }}"}
PYTHON = {"type": "python", "name": "length", "source": "def grade(sample, item):\n"
          "    return min(1.0, len(sample['output_text']) / 10)\n"}
JUDGE = {"type": "score_model", "name": "judge", "model": "tiny-llama", "range": [0, 10],
         "input": [{"role": "user", "content": "Score 0-10: {{ sample.output_text }} for {{ item.answer }}"}],
         "sampling_params": {"temperature": 0, "max_completions_tokens": 4}}
MULTI = {"type": "multi", "name": "both", "graders": {"exact": CHECK, "close": SIMILAR},
         "calculate_output": "0.5 * exact + 0.5 * close"}


@pytest.fixture
def clients(eft_home, tmp_path):
    """The official client of two tenants, on one app whose model servers run in-process."""
    from openai import OpenAI

    settings = get_settings()
    store = Store(settings.resolved_database_url)
    app = service_app(store, settings, models=LocalModels(tmp_path / "cache", max_adapters=1))
    http = {t: TestClient(app, headers=bearer(new_key(store, t))) for t in ("acme", "globex")}
    with http["acme"], http["globex"]:
        yield {t: OpenAI(base_url="http://testserver/v1", api_key=c.headers["Authorization"].removeprefix("Bearer "),
                         http_client=c, max_retries=0) for t, c in http.items()}
    store.close()


def test_every_grader_type_validates_as_openai_answers_and_faults_name_their_field(clients):
    from openai import UnprocessableEntityError

    graders = clients["acme"].fine_tuning.alpha.graders
    for grader in (CHECK, SIMILAR, PYTHON, JUDGE, MULTI):
        assert graders.validate(grader=grader).grader.type == grader["type"]
    unnamed = graders.validate(grader={k: v for k, v in CHECK.items() if k != "name"}).grader
    assert unnamed.name.startswith("grader-")  # OpenAI names an unnamed grader
    with pytest.raises(UnprocessableEntityError) as refused:
        graders.validate(grader={**CHECK, "operation": "startswith"})
    assert refused.value.body["param"] == "grader.operation", refused.value.body
    with pytest.raises(UnprocessableEntityError) as refused:
        graders.validate(grader={**MULTI, "calculate_output": "__import__('os').system('id')"})
    assert refused.value.body["param"] == "grader.calculate_output", refused.value.body


def test_run_scores_equal_the_graders_own_and_a_python_grader_is_bounded(clients):
    from eft.training.graders import grade

    graders = clients["acme"].fine_tuning.alpha.graders
    assert graders.run(grader=CHECK, model_sample="Paris", item=ITEM).reward == 1.0
    assert graders.run(grader=CHECK, model_sample="Lyon", item=ITEM).reward == 0.0
    sample = "the capital is Paris"
    close = graders.run(grader=SIMILAR, model_sample=sample, item=ITEM)
    assert 0 < close.reward < 1 and close.reward == pytest.approx(grade(SIMILAR, sample, ITEM).score)
    assert graders.run(grader=PYTHON, model_sample="12345", item=ITEM).reward == pytest.approx(0.5)
    both = graders.run(grader=MULTI, model_sample="Paris", item=ITEM)
    assert both.sub_rewards["exact"] == 1.0
    assert both.reward == pytest.approx(0.5 + 0.5 * both.sub_rewards["close"])
    forever = {**PYTHON, "source": "def grade(sample, item):\n    while True:\n        pass\n"}
    stopped = graders.run(grader=forever, model_sample="x", item=ITEM)
    assert stopped.reward == 0.0 and stopped.metadata.errors.python_grader_server_error
    assert clients["globex"].fine_tuning.alpha.graders.run(grader=CHECK, model_sample="Paris", item=ITEM).reward == 1.0


def test_a_model_graders_judge_is_a_model_of_this_service_asked_as_the_tenant(clients):
    graders = clients["acme"].fine_tuning.alpha.graders
    judged = graders.run(grader=JUDGE, model_sample="Paris", item=ITEM)
    errors = judged.metadata.errors
    assert judged.metadata.sampled_model_name == "tiny-llama"
    # The bundled model answers, though not with a score: the reply was read (no server error).
    assert not errors.model_grader_server_error and (errors.model_grader_parse_error or 0 <= judged.reward <= 10)
    unknown = graders.run(grader={**JUDGE, "model": "ft:tiny-llama:globex:job-0123456789abcdef"},
                          model_sample="Paris", item=ITEM)
    assert unknown.reward == 0.0 and unknown.metadata.errors.model_grader_server_error
