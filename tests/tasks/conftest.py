from tests.support.text_fixtures import (  # noqa: F401  (session fixtures)
    classifier_dir,
    colbert_dir,
    multilabel_dir,
    prompts_dir,
    reranker_dir,
    splade_dir,
    st_cross_encoder_dir,
)
