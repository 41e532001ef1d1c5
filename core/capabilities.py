"""What a served model can do, by name: the ``capabilities`` a task declares, what a route asks the registry for
(``Registry.get(model, capability)``) and what ``/v1/models`` lists. A ``StrEnum``: each member is its wire
value (``Capability.EMBEDDINGS == "embeddings"``, and it prints and serializes as ``embeddings``), so model
cards, error messages and SageMaker's ``route=`` read as plain names."""

from __future__ import annotations

from enum import StrEnum


class Capability(StrEnum):
    #: ``/v1/embeddings`` (and TEI's ``/embed``, Cohere's ``/v1/embed``, ``/v2/embed``): one vector per input
    #: (multi-vector models: one per token)
    EMBEDDINGS = "embeddings"
    #: ``/v1/embeddings/sparse`` and TEI's ``/embed_sparse``: SPLADE vectors
    EMBEDDINGS_SPARSE = "embeddings_sparse"
    #: ``/v1/rerank``, Cohere's ``/v2/rerank``: a relevance score per document
    RERANK = "rerank"
    #: ``/v1/classify`` and TEI's ``/predict``: a score per label
    CLASSIFY = "classify"
    #: ``/v1/score``: late-interaction MaxSim of documents against a query
    SCORE = "score"
    #: ``/v1/tokenize``, TEI's ``/tokenize``, ``/decode`` and ``/info``
    TOKENIZE = "tokenize"
    #: TEI's ``/embed_all``: every token's vector, unpooled
    EMBED_ALL = "embed_all"

    def __repr__(self) -> str:
        """As the plain string: messages that show a capability, or a list of them, read as before."""
        return repr(self.value)


#: capabilities every task of a kind offers beside its main one (never a model's default route)
AUXILIARY_CAPABILITIES = frozenset({Capability.TOKENIZE, Capability.SCORE, Capability.EMBED_ALL})
