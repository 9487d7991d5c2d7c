"""What a succeeded job serves and gives: the model servers' engine (`engine.py`), model ids
in OpenAI's form (`model_ids.py`), exports of a job's model (`exports.py`) and downloads of what
it wrote (`downloads.py`)."""
