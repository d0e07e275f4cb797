import pytest
import torch

from hvd_flexcomm.messages import build_messages, message_tag


def _params():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 30),
                            torch.nn.Linear(30, 5))
    return list(m.parameters())


def test_model_granularity_is_one_message_per_dtype():
    params = _params()
    half = torch.nn.Parameter(torch.zeros(7, dtype=torch.float16))
    msgs = build_messages(params + [half], "model", 1)
    assert [m.numel for m in msgs] == [sum(p.numel() for p in params), 7]
    assert msgs[0].offsets[1] == params[0].numel()
    assert torch.count_nonzero(msgs[0].residual) == 0 and msgs[1].dtype == torch.float16


def test_bucket_granularity_reverses_and_caps():
    params = _params()
    msgs = build_messages(params, "bucket", 4 * 620)  # 620 floats: the second Linear's weight+bias
    assert msgs[0].params[0] is params[-1]  # backward order
    assert all(m.nbytes() <= 4 * 620 or len(m.params) == 1 for m in msgs)
    assert sum(m.numel for m in msgs) == sum(p.numel() for p in params)
    assert [m.key for m in msgs] == [f"hvd_flexcomm.msg{i}" for i in range(len(msgs))]
    assert all(m.name.startswith(m.key + ".") and len(m.name) == len(m.key) + 9 for m in msgs)


def test_message_names_differ_between_parameter_sets_and_agree_across_builds():
    """Two optimizers of one process (a backbone's and a head's) must not share collective
    names; two ranks building the same model must."""
    params = _params()
    names = {p: f"layer.{i}" for i, p in enumerate(params)}
    backbone = build_messages(params[:4], "model", 0, names=names)
    head = build_messages(params[4:], "model", 0, names=names)
    again = build_messages(params[:4], "model", 0, names=dict(names))
    assert backbone[0].key == head[0].key == "hvd_flexcomm.msg0"  # checkpoint keys as before
    assert backbone[0].name != head[0].name
    assert backbone[0].name == again[0].name
    renamed = build_messages(params[:4], "model", 0, names={p: "x." + n for p, n in names.items()})
    assert renamed[0].name != backbone[0].name
    # without names the shapes alone tag the message: still different here
    assert build_messages(params[:4], "model", 0)[0].name != build_messages(params[4:], "model",
                                                                             0)[0].name
    assert message_tag(params[:2], names) == message_tag(list(params[:2]), dict(names))


def test_flat_grads_and_write_back():
    params = _params()
    for i, p in enumerate(params):
        p.grad = None if i == 1 else torch.full_like(p, float(i))
    (msg,) = build_messages(params, "model", 0)
    flat = msg.flat_grads()
    assert flat.numel() == msg.numel and float(flat[msg.offsets[1]:msg.offsets[2]].abs().sum()) == 0
    msg.write_grads(torch.arange(msg.numel, dtype=torch.float32))
    assert float(params[2].grad.reshape(-1)[0]) == msg.offsets[2]


def test_bad_granularity():
    with pytest.raises(ValueError, match="granularity"):
        build_messages(_params(), "layer", 1)
