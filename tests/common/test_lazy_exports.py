"""``lazy_exports``: both lazy packages resolve, cache and refuse names through it."""

from __future__ import annotations

import pytest

import featurestream
import featurestream.pipeline
from featurestream.common.exports import lazy_exports


def test_a_name_is_imported_on_first_access_and_cached() -> None:
    namespace: dict[str, object] = {}
    getattr_, dir_ = lazy_exports("pkg", namespace, {"dumps": "json"})
    import json

    assert getattr_("dumps") is json.dumps
    assert namespace == {"dumps": json.dumps}
    assert dir_() == ["dumps"]


def test_an_unknown_name_is_an_attribute_error_naming_the_package_and_changes_nothing() -> None:
    namespace: dict[str, object] = {}
    getattr_, _ = lazy_exports("pkg", namespace, {"dumps": "json"})
    with pytest.raises(AttributeError, match=r"^module 'pkg' has no attribute 'loads'$"):
        getattr_("loads")
    assert namespace == {}


def test_the_pipeline_package_exports_lazily_and_names_itself_in_refusals() -> None:
    from featurestream.pipeline.features import FeatureRule

    assert featurestream.pipeline.FeatureRule is FeatureRule
    assert "FeatureSet" in dir(featurestream.pipeline)
    with pytest.raises(AttributeError, match=r"module 'featurestream.pipeline' has no attribute 'Nope'"):
        featurestream.pipeline.Nope  # noqa: B018


def test_the_root_lists_optional_exports_too() -> None:
    assert {*featurestream._EXPORTS, *featurestream._OPTIONAL} <= set(dir(featurestream))
