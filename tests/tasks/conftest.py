from tests.support import text_fixtures as _fixtures

# the session fixtures of the text-task model folders
reranker_dir = _fixtures.reranker_dir
st_cross_encoder_dir = _fixtures.st_cross_encoder_dir
classifier_dir = _fixtures.classifier_dir
multilabel_dir = _fixtures.multilabel_dir
colbert_dir = _fixtures.colbert_dir
prompts_dir = _fixtures.prompts_dir
splade_dir = _fixtures.splade_dir
