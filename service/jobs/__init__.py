"""Jobs: the manager every route calls once (`manager.py:JobService`), the lifecycle of a
job's status (`lifecycle.py`, pure), a stored job's wire form (`wire.py`) and progress
(`progress.py`), and OpenAI's fine-tuning shapes mapped onto jobs (`openai.py`)."""
