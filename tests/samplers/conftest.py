"""Fixtures of the sampler tests (helpers live in sampler_helpers.py)."""

import pytest
from sampler_helpers import mixture_sources_dict


@pytest.fixture(scope="session")
def mixture_sources():
    return mixture_sources_dict()
