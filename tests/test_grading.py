"""Grading by reach (labsupport/checks/grading.py, issue 48): a learner's function that can reach a denied
package callable is refused in one sentence that names it and the path to it, whichever way it holds
it; while a checker runs, a call the walk cannot see (a built name, eval) is refused by a stand-in."""

import functools

import pytest

import labsupport as ls
from labsupport.checks import CheckFailed
from labsupport.checks.grading import Exercise, denied_members, first_refused
from labsupport.engine.config import PRESETS, ModelConfig
from labsupport.lab import roofline

EXERCISE = Exercise("decode step cost", "the FLOPs and bytes of one decode step",
                    computed_by=("labsupport.engine.config.ModelConfig.decode_flops",),
                    receives=("labsupport.engine.config.ModelConfig",),
                    allowed=("labsupport.engine.config.ModelConfig.head_dim",))


def clean(config, batch, context, bytes_per_value):
    return 2 * config.hidden_size * batch, config.head_dim * bytes_per_value


def via_property(config, batch, context, bytes_per_value):
    return 1, config.num_parameters * bytes_per_value


def via_module_chain(config, batch, context, bytes_per_value):
    cost = ls.lab.roofline.decode_step_cost(config, batch, context)
    return cost.flops, cost.bytes


def via_default(config, batch, context, bytes_per_value, f=roofline.decode_step_cost):
    return f(config, batch, context)


def via_keyword_default(config, batch, context, bytes_per_value, *, f=roofline.decode_step_cost):
    return f(config, batch, context)


def _closure():
    f = roofline.decode_step_cost

    def inner(config, batch, context, bytes_per_value):
        return f(config, batch, context)
    return inner


def helper(config):
    return config.decode_flops(1, 1)


def via_helper(config, batch, context, bytes_per_value):
    return helper(config), 0


def via_import_inside(config, batch, context, bytes_per_value):
    from labsupport.lab.roofline import decode_step_cost
    return decode_step_cost(config, batch, context)


def via_getattr_literal(config, batch, context, bytes_per_value):
    return getattr(config, "params_read_per_step"), 0


def via_nested_lambda(config, batch, context, bytes_per_value):
    count = lambda c: c.matmul_params                             # noqa: E731
    return count(config), 0


class Callable:
    def __call__(self, config, batch, context, bytes_per_value):
        return config.kv_values_per_token, 0


class Sub(Callable):
    pass


CASES = {
    "a property of the config": (via_property, "ModelConfig.num_parameters", ".num_parameters"),
    "a module chain from ls": (via_module_chain, "lab.roofline.decode_step_cost", "roofline.decode_step_cost"),
    "a default argument": (via_default, "lab.roofline.decode_step_cost", "default argument"),
    "a keyword default": (via_keyword_default, "lab.roofline.decode_step_cost", "default argument f"),
    "a closure cell": (_closure(), "lab.roofline.decode_step_cost", "closure f"),
    "a helper of the learner's": (via_helper, "ModelConfig.decode_flops", "helper"),
    "an import inside": (via_import_inside, "lab.roofline.decode_step_cost", "labsupport.lab.roofline"),
    "getattr with a literal": (via_getattr_literal, "ModelConfig.params_read_per_step", ".params_read_per_step"),
    "a nested lambda": (via_nested_lambda, "ModelConfig.matmul_params", ".matmul_params"),
    "a callable object": (Callable(), "ModelConfig.kv_values_per_token", "__call__"),
    "a subclass's inherited call": (Sub(), "ModelConfig.kv_values_per_token", "base"),
    "a partial": (functools.partial(via_default, bytes_per_value=2), "lab.roofline.decode_step_cost", "partial"),
    "the package's function itself": (roofline.decode_step_cost, "lab.roofline.decode_step_cost", None),
    "a bound method of a config": (PRESETS["tiny-llama"].decode_flops, "ModelConfig.decode_flops", None),
    "a checker's own helper": (lambda c, b, x, y: roofline.decode_step_cost, "lab.roofline.decode_step_cost", None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_way_of_holding_a_denied_callable_is_refused_and_named(name):
    fn, refused, path = CASES[name]
    error = first_refused(EXERCISE, fn)
    assert isinstance(error, CheckFailed), name
    message = str(error)
    assert refused in message and "\n" not in message
    assert message.startswith("decode step cost: expected your own code, got a call of the package's")
    if path:
        assert path in message


def test_the_learners_own_method_reaches_nothing_denied():
    assert first_refused(EXERCISE, clean) is None
    assert first_refused(EXERCISE, lambda config, *rest: config.head_dim) is None      # allowed: the data


def test_a_learners_name_that_equals_a_denied_attribute_is_not_an_attribute_read():
    def num_parameters(config):                                   # the learner's own helper, by that name
        return config.hidden_size * 2

    def answer(config, batch, context, bytes_per_value):
        return num_parameters(config), 0

    assert first_refused(EXERCISE, answer) is None


def test_the_received_classes_deny_their_methods_and_properties_but_not_their_fields():
    names = {name for name, _ in denied_members(ModelConfig)}
    assert {"num_parameters", "decode_flops", "params_read_per_step", "kv_values_per_token"} <= names
    assert "hidden_size" not in names and "__post_init__" not in names


CHECKER = """
from labsupport.checks import CheckFailed
from labsupport.checks.grading import Exercise, graded
from labsupport.engine.config import PRESETS


@graded(Exercise("a test exercise", "the width of two hidden vectors",
                 receives=("labsupport.engine.config.ModelConfig",)))
def check_width(fn):
    config = PRESETS["tiny-llama"]
    assert config.num_parameters > 0                     # the checker's own use of a denied property passes
    if fn(config) != 2 * config.hidden_size:
        raise CheckFailed("a test exercise: wrong")
    print("Correct")
"""
namespace = {"__name__": "labsupport.checks.a_test_checker"}      # what a checker module's frames say
exec(compile(CHECKER, "a_test_checker.py", "exec"), namespace)      # noqa: S102
check_width = namespace["check_width"]


def test_a_call_the_walk_cannot_see_is_refused_while_the_checker_runs():
    built = "".join(["num_", "parameters"])                          # no constant the walk could read

    def sneaky(config):
        return getattr(config, built) * 0 + 2 * config.hidden_size

    with pytest.raises(CheckFailed, match="got a call of the package's ModelConfig.num_parameters"):
        check_width(sneaky)


def test_a_refused_call_counts_even_when_the_learners_code_catches_it():
    def sneaky(config):
        try:
            return eval("config." + "decode" + "_flops(1, 1)")           # noqa: S307 - what no walk can see
        except Exception:                                          # noqa: BLE001
            return 2 * config.hidden_size

    with pytest.raises(CheckFailed, match="got a call of the package's ModelConfig.decode_flops"):
        check_width(sneaky)


def test_the_stand_ins_are_gone_after_the_checker_and_the_right_answer_passes(capsys):
    before = ModelConfig.__dict__["num_parameters"]
    with pytest.raises(CheckFailed):
        check_width(lambda config: eval("config.num_" + "parameters"))            # noqa: S307
    assert ModelConfig.__dict__["num_parameters"] is before and PRESETS["tiny-llama"].num_parameters > 0
    check_width(lambda config: 2 * config.hidden_size)
    assert "Correct" in capsys.readouterr().out


CLASS_CHECKER = """
from labsupport.checks import CheckFailed
from labsupport.checks.grading import Exercise, graded
from labsupport.engine.config import PRESETS
from labsupport.engine.kv_cache import StaticKVCache


@graded(Exercise("a class exercise", "the bytes of a float cache",
                 computed_by=("labsupport.engine.kv_cache.StaticKVCache",
                              "labsupport.engine.kv_cache.StaticKVCache.nbytes")))
def check_bytes(fn):
    config = PRESETS["tiny-llama"]
    mine = StaticKVCache(config, 1, 4)                      # the checker's own instance: built and read freely
    assert isinstance(mine, StaticKVCache) and mine.nbytes > 0
    if fn(config) != mine.nbytes:
        raise CheckFailed("a class exercise: wrong")
    print("Correct")
"""
class_namespace = {"__name__": "labsupport.checks.another_test_checker"}
exec(compile(CLASS_CHECKER, "another_test_checker.py", "exec"), class_namespace)      # noqa: S102
check_bytes = class_namespace["check_bytes"]


def test_a_class_named_in_computed_by_is_refused_when_built_by_a_name_no_walk_reads(capsys):
    import importlib
    from labsupport.engine.kv_cache import StaticKVCache
    built = "".join(["Static", "KV", "Cache"])

    def sneaky(config):
        cls = getattr(importlib.import_module("labsupport.engine.kv_cache"), built)
        return cls(config, 1, 4).nbytes

    init = StaticKVCache.__dict__["__init__"]
    with pytest.raises(CheckFailed, match="got a call of the package's engine.kv_cache.StaticKVCache"):
        check_bytes(sneaky)
    assert StaticKVCache.__dict__["__init__"] is init                      # put back
    assert "nbytes" in StaticKVCache.__dict__ and isinstance(StaticKVCache.__dict__["nbytes"], (property, type(init)))
