"""The graph's options and inputs, declared once (graphs/options.py): GraphInputs' rules between its fields, the
same through check(), a config (from_dict) and its JSON form; GraphOptions through the Python keywords. (The
command line's agreement with them: tests/commands/test_graph.py.)"""
import pytest

from circuitlab.errors import ConfigError, InputError
from circuitlab.graphs.options import DEFAULTS, GraphInputs, GraphOptions, graph_options
from circuitlab.spec import schema

PLANTED = {"planted": True, "prompt": "xAxBxyx"}
SAVED = {"checkpoint": "runs/m", "transcoders": "runs/t", "prompt": "Lily saw"}

REFUSED = [  # (inputs, the one line check() says)
    ({"planted": True}, "give --prompt TEXT (the text whose next token the graph explains), or run the demo: "
                        "circuitlab graph demo"),
    ({**PLANTED, "foil": "y"}, "--foil needs --target (the graph explains target minus foil)"),
    ({**PLANTED, "target": "y", "foil": "y"}, "the foil 'y' is the target: give a different token to contrast with "
                                              "(or no --foil)"),
    ({**PLANTED, "checkpoint": "runs/m"}, "--planted uses the built-in model: drop "
                                          "--checkpoint/--transcoders/--transcoder-set"),
    ({**PLANTED, "transcoder_set": "clt"}, "--planted uses the built-in model: drop "
                                           "--checkpoint/--transcoders/--transcoder-set"),
    ({"checkpoint": "runs/m", "prompt": "Lily"}, "a graph of runs/m needs transcoders for it (--transcoders DIR); to "
                                                 "make a set, one per MLP, in minutes: circuitlab sae train --config "
                                                 "transcoders-quick --set model=runs/m --out runs/transcoders-m, then "
                                                 "give --transcoders runs/transcoders-m (docs/dictionaries.md: sets for "
                                                 "real models)"),
    ({"transcoders": "runs/t", "prompt": "Lily"}, "give --checkpoint DIR and --transcoders DIR (or --planted for the "
                                                  "built-in model)"),
    ({**SAVED, "target": 3}, "target must be text, got 3"),
    ({**SAVED, "out": None}, "out must be text, got None"),
]


def test_graph_inputs_defaults_and_their_json_form():
    inputs = GraphInputs(**PLANTED).check()
    assert (inputs.out, inputs.checkpoint, inputs.target, inputs.qk, inputs.overwrite) == ("runs/graph", None, None,
                                                                                            False, False)
    assert GraphInputs.from_dict(PLANTED) == inputs and GraphInputs.from_dict(inputs.to_dict()) == inputs
    saved = GraphInputs.from_dict({**SAVED, "target": " cat", "foil": " dog", "qk": True})
    assert (saved.target, saved.foil, saved.qk) == (" cat", " dog", True)
    props = schema(GraphInputs)["properties"]
    assert list(props) == ["checkpoint", "transcoders", "transcoder_set", "planted", "prompt", "target", "foil",
                           "mmap", "qk", "partial", "out", "overwrite"]
    assert props["out"]["default"] == "runs/graph" and props["planted"] == {"type": "boolean", "default": False,
                                                                             "description": props["planted"]["description"]}


@pytest.mark.parametrize("given, said", REFUSED)
def test_graph_inputs_are_refused_with_one_rule_by_check_and_a_config(given, said):
    with pytest.raises(InputError) as e:
        GraphInputs(**given).check()
    assert str(e.value) == said
    with pytest.raises(ConfigError) as e:
        GraphInputs.from_dict(given)
    assert str(e.value) == said


def test_graph_options_keywords_read_the_class():
    assert graph_options() == DEFAULTS == GraphOptions().check()
    assert graph_options(qk_heads=3) == GraphOptions(qk_heads=3)
    with pytest.raises(InputError, match="^qk_heads must be a whole number >= 1, got 0$"):
        graph_options(qk_heads=0)
    with pytest.raises(ConfigError, match="did you mean 'node_threshold'"):
        graph_options(node_treshold=0.5)
