"""The Loader's options are one table (``LoaderSettings``' fields): the Loader's signature,
its attributes and the checks all follow it, and enum options take their strings once."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import ConfigError, Loader
from tilefeed.pipeline.options import DATALOADER_ONLY, Layout, Shuffle, TargetsLayout
from tilefeed.pipeline.recipe.batch_mix import BatchMix, MixStyle
from tilefeed.pipeline.recipe.policies import AutoAugment
from tilefeed.pipeline.recipe.policy_tables import Family, Policy, PolicyInterpolation, Table
from tilefeed.pipeline.recipe.recipe import Crop, Interpolation, Recipe
from tilefeed.store.choices import choice
from tilefeed.pipeline.settings import ALIASES, LoaderSettings, Setting, read_back


def options() -> list[str]:
    """The option fields, in their order (``alone`` is settled from others, never given)."""
    return [f.name for f in fields(LoaderSettings) if f.metadata["check"] is not None]


def test_the_loader_signature_is_the_option_table_in_its_order() -> None:
    keywords = [name for name, p in inspect.signature(Loader.__init__).parameters.items()
                if p.kind is p.KEYWORD_ONLY or name == "batch_size"]
    # DataLoader's name for an aliased option stands just before tilefeed's in the signature
    expected = [name for option in options()
                for name in ((ALIASES[option], option) if option in ALIASES else (option,))]
    assert keywords == expected


def test_a_choice_takes_only_the_members_its_option_names() -> None:
    assert choice(Layout, "NHWC", "layout", among=(Layout.NHWC,)) is Layout.NHWC
    for value in ("NCHW", Layout.NCHW):
        with pytest.raises(ConfigError, match="^layout must be one of NHWC, got "):
            choice(Layout, value, "layout", among=(Layout.NHWC,))


def test_every_option_has_its_entry_in_the_loader_docstring() -> None:
    """The docstring is where each option's trade-off is read: a keyword without an entry is a
    defect (an alias is named in its DataLoader name's entry)."""
    documented: dict[str, str] = {}
    entry = ""
    for line in (inspect.getdoc(Loader) or "").split("Parameters\n----------\n")[1].splitlines():
        head = re.match(r"^([a-z_][a-z_0-9, ]*) :", line)
        if head:
            entry = head.group(1)
            documented.update((name.strip(), "") for name in entry.split(","))
        elif entry:
            documented[entry.split(",")[0].strip()] += line
    keywords = [name for name in inspect.signature(Loader.__init__).parameters
                if name not in ("self", "dataloader_options")]
    for name in keywords:
        if name in ALIASES:
            assert f"``{name}``" in documented[ALIASES[name]], name
        else:
            assert name in documented, name


def test_every_loader_attribute_reads_its_setting(store: Path) -> None:
    faces = {name for name, value in vars(Loader).items() if isinstance(value, Setting)}
    assert faces and faces <= set(options())
    with Loader(store, 8, shuffle="shard", layout="channels_last", workers=1, num_workers=None) as loader:
        for name in faces:
            assert getattr(loader, name) is getattr(loader.settings, name)
        assert loader.shuffle is Shuffle.SHARD and loader.layout is Layout.CHANNELS_LAST
        with pytest.raises(AttributeError, match="^batch_size is fixed when the Loader is made"):
            loader.batch_size = 4


def test_an_attribute_is_read_back_only_as_its_option_is_typed() -> None:
    class Typed:
        seed: int
    assert isinstance(vars(read_back(Typed))["seed"], Setting)
    with pytest.raises(TypeError, match="^Mistyped.seed is annotated float, but its option in LoaderSettings"):
        @read_back
        class Mistyped:
            seed: float
    with pytest.raises(TypeError, match="^Unknown.sead is annotated, but LoaderSettings has no option sead"):
        @read_back
        class Unknown:
            sead: int
    with pytest.raises(TypeError, match="^Settled.alone is annotated, but LoaderSettings settles alone "
                                        "from the options: it is none"):
        @read_back
        class Settled:
            alone: bool


def test_an_alias_and_its_option_are_one_setting(store: Path) -> None:
    with Loader(store, 8, prefetch=3) as one, Loader(store, 8, prefetch_factor=3) as other:
        assert one.prefetch == other.prefetch == other.prefetch_factor == 3
    with pytest.raises(ConfigError, match="^give num_workers or workers, not both"):
        Loader(store, 8, num_workers=1, workers=2)


@pytest.mark.parametrize("option, value, message", [
    ("layout", "CHW", "layout must be one of NCHW, NHWC, channels_last, got 'CHW'"),
    ("targets_layout", "list", "targets_layout must be one of dicts, padded, got 'list'"),
    ("targets", "labels", "targets must be one of boxes, masks, got 'labels'"),
    ("shuffle", "random", "shuffle must be True, False or one of global, shard, none, got 'random'"),
    ("dtype", torch.int32, "dtype must be one of"),
    ("seed", None, "seed must be an int >= 0, got None"),
    ("shuffle_window", None, "shuffle_window must be an int >= 1, got None"),
    ("cache_limit", 0, "cache_limit must be an int >= 1, got 0"),
])
def test_a_bad_choice_is_named_with_the_values_it_takes(store: Path, option: str, value: object,
                                                         message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        Loader(store, 8, **{option: value})  # type: ignore[arg-type]


def test_the_first_bad_option_in_the_signature_is_the_one_named(store: Path) -> None:
    with pytest.raises(ConfigError, match="^batch_size must be an int >= 1, got None"):
        Loader(store, None, layout="CHW")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^batch_size"):
        Loader(store, 0, layout="CHW")
    with pytest.raises(ConfigError, match="^layout"):
        Loader(store, 8, layout="CHW", targets_layout="list")


def test_strings_become_members_once(store: Path) -> None:
    with Loader(store, 8, layout="NHWC", targets_layout="padded") as loader:
        assert loader.layout is Layout.NHWC and loader.settings.targets_layout is TargetsLayout.PADDED
    assert Layout.CHANNELS_LAST.memory is Layout.NHWC and Layout.NCHW.memory is Layout.NCHW


def test_dataloader_only_options_are_warned_with_their_reason(store: Path) -> None:
    import tilefeed.pipeline.settings as settings

    settings._warned.discard("sampler")
    reason = DATALOADER_ONLY["sampler"][:30]
    with pytest.warns(UserWarning, match=f"^Loader ignores DataLoader's sampler=: {reason}"):
        Loader(store, 8, sampler=[0, 1, 2])
    with pytest.raises(TypeError, match="unexpected keyword arguments: colate_fn"):
        Loader(store, 8, colate_fn=None)


def test_public_records_take_their_enums_as_strings() -> None:
    trivial = AutoAugment("trivial_wide")  # type: ignore[arg-type]
    assert trivial == AutoAugment(Policy.TRIVIAL_WIDE) and trivial.policy is Policy.TRIVIAL_WIDE
    rand = AutoAugment("rand", num_ops=2, magnitude=9)  # type: ignore[arg-type]
    assert rand.draw(0, 0, np.arange(3))["aa_op"].shape[0] == 3
    timm = AutoAugment("auto_imagenet", family="timm", table="v0",  # type: ignore[arg-type]
                       interpolation="random")  # type: ignore[arg-type]
    assert (timm.family, timm.table, timm.interpolation) == (Family.TIMM, Table.V0, PolicyInterpolation.RANDOM)
    with pytest.raises(ConfigError, match="^auto-augment policy must be one of trivial_wide, rand, "):
        AutoAugment("trivial")  # type: ignore[arg-type]
    recipe = Recipe(interpolation="bicubic", crop="none")  # type: ignore[arg-type]
    assert recipe.interpolation is Interpolation.BICUBIC and recipe.crop is Crop.NONE
    assert BatchMix(num_classes=10, mixup_alpha=0.8, style="timm").style is MixStyle.TIMM  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", [AutoAugment("trivial_wide"),  # type: ignore[arg-type]
                                    AutoAugment("rand", num_ops=2, magnitude=9),  # type: ignore[arg-type]
                                    AutoAugment("auto_imagenet")])  # type: ignore[arg-type]
def test_a_policy_named_by_strings_trains_as_its_members_do(store: Path, policy: AutoAugment) -> None:
    members = AutoAugment(Policy(policy.policy.value), num_ops=policy.num_ops, magnitude=policy.magnitude)
    batches = []
    for auto in (policy, members):
        with Loader(store, 8, train=True, shuffle=False, workers=1, recipe=Recipe(auto_augment=auto)) as loader:
            batches.append(next(iter(loader))[0])
    assert torch.equal(*batches)
