import pytest

import json

from skilljax import config as config_lib
from skilljax.config import parse_arg


def test_parse_arg_types_and_flags():
    c = parse_arg("model=small,runlocal,steps=20,lr=0.5,eval=false",
                  model="tiny", runlocal=False, steps=100, lr=1e-3, eval=True)
    assert (c.model, c.runlocal, c.steps, c.lr, c.eval) == ("small", True, 20, 0.5, False)
    assert parse_arg(None, steps=3).steps == 3


def test_parse_arg_errors():
    with pytest.raises(ValueError, match="Unknown config argument 'stepz'"):
        parse_arg("stepz=1", steps=1)
    with pytest.raises(ValueError, match="needs a value"):
        parse_arg("steps", steps=1)
    lazy = parse_arg("extra=3,name=abc", lazy=True)
    assert (lazy.extra, lazy.name) == (3, "abc")


def test_workdir_config_round_trip_and_overrides(tmp_path):
    c = config_lib.base_config()
    c.seed, c.rl.steps, c.skills.budgets, c.env.kwargs = 1, 3, (2, 1), {"max_steps": 7}
    c.model.remat = "dots"
    config_lib.write_json(tmp_path / "config.json", config_lib.to_dict(c))
    back = config_lib.workdir_config(tmp_path, ["--config.eval.seeds=3",
                                                "--config.rl.learning_rate=1"])
    assert back.eval.seeds == 3 and back.rl.learning_rate == 1.0
    assert isinstance(back.rl.learning_rate, float) and back.rl.steps == 3
    assert list(back.skills.budgets) == [2, 1] and back.model.remat == "dots"
    assert back.model.overrides.num_layers is None and back.env.kwargs.max_steps == 7
    assert json.loads((tmp_path / "config.json").read_text())["rl"]["steps"] == 3
    with pytest.raises(FileNotFoundError, match="skilljax.train workdir"):
        config_lib.workdir_config(tmp_path / "nothing")
    with pytest.raises(KeyError, match="did you mean 'seeds'"):
        config_lib.workdir_config(tmp_path, ["--config.eval.seed=3"])
    with pytest.raises(ValueError, match="overrides look like"):
        config_lib.workdir_config(tmp_path, ["--eval.seeds=3"])
    (tmp_path / "config.json").write_text(json.dumps({"rl": {"stepz": 3}}))
    with pytest.raises(KeyError, match="stepz.*the config the run was trained with"):
        config_lib.workdir_config(tmp_path)


def test_schema_is_locked_and_checked():
    c = config_lib.base_config()
    with pytest.raises(AttributeError):
        c.rl.stepz = 3  # a typo in a config file
    with pytest.raises(TypeError):
        c.rl.steps = "many"
    c.env.kwargs.anything = 1  # free-form nodes take any key
    config_lib.check_schema(c)
    c.model.unlock()
    c.model.overrides = {"num_layers": 2}  # replaced a section instead of updating it
    with pytest.raises(ValueError, match="missing keys: model.overrides.attention_block, model.overrides.embed_dim"):
        config_lib.check_schema(c)
    c = config_lib.base_config()
    c.unlock()
    c.rl.unlock()
    c.rl.learning_rat = 1.0
    with pytest.raises(ValueError, match=r"unknown keys: rl.learning_rat \(did you mean "
                                         r"rl.learning_rate\?\)"):
        config_lib.check_schema(c)


def test_older_workdir_config_is_migrated(tmp_path):
    old = config_lib.to_dict(config_lib.base_config())
    for key in ("param_dtype", "remat", "scan_layers", "lora"):
        del old["model"][key]
    old["model"].update(dtype="bfloat16", overrides={**old["model"]["overrides"], "remat": True})
    del old["sampler"]
    config_lib.write_json(tmp_path / "config.json", old)
    back = config_lib.workdir_config(tmp_path)
    assert back.model.remat == "full" and back.model.param_dtype == "bfloat16"  # as it trained


def test_typed_placeholders_take_command_line_values():
    c = config_lib.base_config()
    config_lib.apply_overrides(c, ["--config.model.remat=dots",
                                   "--config.model.overrides.num_layers=4",
                                   "--config.model.overrides.model_type=qwen2",
                                   "--config.rl.mini_batch_size=None"])
    assert c.model.remat == "dots" and c.model.overrides.num_layers == 4
    assert c.model.overrides.model_type == "qwen2" and c.rl.mini_batch_size is None
    with pytest.raises(TypeError):
        config_lib.apply_overrides(c, ["--config.model.overrides.num_layers=many"])


@pytest.mark.parametrize("name", ["sage_apps", "sage_appworld"])
def test_sage_arms_train_on_the_same_episodes_per_step(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, f"configs/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    extra = "" if name == "sage_apps" else ",checkpoint=/ckpt"
    arms = {v: mod.get_config(f"variant={v}{extra}") for v in config_lib.SAGE_VARIANTS}
    chain = arms["sage"].sage.chain_length
    for v, c in arms.items():  # episodes per step: tasks (or scenarios) x group x chain
        per_task = chain if c.sage.enabled else 1
        assert c.rl.tasks_per_step * c.rl.group_size * per_task == \
            arms["sage"].rl.tasks_per_step * arms["sage"].rl.group_size * chain, v
    assert (arms["grpo"].sage.enabled, arms["sequential"].sage.reward, arms["sage"].sage.reward) \
        == (False, False, True)
    with pytest.raises(ValueError, match="Unknown variant"):
        mod.get_config(f"variant=reuse{extra}")
