"""Chat templates: rendered text and token ids equal transformers' apply_chat_template on a
Qwen2.5-style template (single turn, system, multi-turn, tools), raise_exception, the files a
template is read from, stop tokens, and the text appended between turns."""

import json

import jinja2
import pytest

from jaxrl_frontier.data.tasks.chat import ChatTemplate, ChatTemplateError, read_template
from jaxrl_frontier.models.tokenizer import HFTokenizer
from jaxrl_frontier.run.config import sections

# The Qwen2.5-Instruct template (tools, tool calls, tool responses, default system prompt).
QWEN25_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user '
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    '\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name '
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "what is 12 + 30? the answer is 42.",
    '<tool_call> {"name": "calc", "arguments": {"expr": "3*(4+5)"}} </tool_call>',
    "# Tools You may call one or more functions to assist with the user query.",
    "system user assistant tool_response café naïve",
]

CONVERSATIONS = {
    "single_turn": [{"role": "user", "content": "what is 12 + 30?"}],
    "system": [
        {"role": "system", "content": "You solve arithmetic."},
        {"role": "user", "content": "what is 7 * 6? café"},
    ],
    "multi_turn": [
        {"role": "user", "content": "move the agent"},
        {"role": "assistant", "content": "up"},
        {"role": "user", "content": "a at (0, 1)\n"},
        {"role": "assistant", "content": "right", "tool_calls": None},
        {"role": "user", "content": "done?"},
    ],
    "tools": [
        {"role": "user", "content": "what is 3*(4+5)?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calc", "arguments": {"expr": "3*(4+5)"}}}
            ],
        },
        {"role": "tool", "content": "27"},
        {"role": "tool", "content": "naïve é"},
    ],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "évalue an arithmetic expression",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny byte-level BPE with Qwen's special tokens and the template in
    tokenizer_config.json, as an instruct model directory holds them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    d = tmp_path_factory.mktemp("qwen_like")
    tok.save(str(d / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "chat_template": QWEN25_TEMPLATE,
    }
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


@pytest.fixture(scope="module")
def hf_tok(model_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(model_dir))


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("gen", [True, False])
def test_ids_equal_transformers_apply_chat_template(model_dir, hf_tok, name, gen):
    messages = CONVERSATIONS[name]
    tools = TOOLS if name == "tools" else None
    chat = ChatTemplate.from_dir(model_dir)
    ours = HFTokenizer(model_dir)
    text = chat.render(messages, add_generation_prompt=gen, tools=tools)
    ref_text = hf_tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=gen, tokenize=False
    )
    assert text == ref_text
    ref_ids = hf_tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=gen, tokenize=True, return_dict=False
    )
    ids = chat.encode(ours, messages, add_generation_prompt=gen, tools=tools)
    assert ids == list(ref_ids)
    assert ids.count(ours.encode("<|im_start|>")[0]) == text.count("<|im_start|>")


def test_single_turn_prompt_and_stop_tokens(model_dir):
    chat = ChatTemplate.from_dir(model_dir)
    tok = HFTokenizer(model_dir)
    assert chat.prompt("2+2?") == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chat.assistant_suffix == "<|im_end|>\n"
    assert chat.stop_text(tok) == "<|im_end|>"
    im_end = tok.encode("<|im_end|>")
    assert len(im_end) == 1
    # the template's turn end and the EOS (here also <|im_end|>, as Qwen2.5-Instruct's)
    assert chat.stop_token_ids(tok) == im_end
    eos_other = HFTokenizer(model_dir, eos="<|endoftext|>")
    assert chat.stop_token_ids(eos_other) == [im_end[0], tok.encode("<|endoftext|>")[0]]


def test_turn_text_extends_the_context_exactly(model_dir, hf_tok):
    chat = ChatTemplate.from_dir(model_dir)
    tok = HFTokenizer(model_dir)
    history = [{"role": "user", "content": "move the agent"}]
    prompt_ids = chat.encode(tok, history, add_generation_prompt=True)
    sampled = tok.encode("up") + chat.stop_token_ids(tok, include_eos=False)
    history = history + [{"role": "assistant", "content": "up"}]
    obs = [{"role": "user", "content": "a at (0, 1)\n"}]
    appended = tok.encode(chat.turn_text(tok, history, obs))
    ref = hf_tok.apply_chat_template(
        history + obs, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert prompt_ids + sampled + appended == list(ref)
    with pytest.raises(ValueError, match="assistant"):
        chat.turn_text(tok, obs, obs)


def test_raise_exception_and_a_history_rewriting_template():
    alternating = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
        "[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}{% endfor %}"
    )
    chat = ChatTemplate(alternating, {"eos_token": "</s>"})
    assert chat.render([{"role": "user", "content": "a"}]) == "[user]a</s>"
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        chat.render([{"role": "assistant", "content": "a"}])
    from transformers.utils.chat_template_utils import render_jinja_template

    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        render_jinja_template([[{"role": "assistant", "content": "a"}]], chat_template=alternating)
    # a template that shows only the last assistant message cannot be extended turn by turn
    last_only = (
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
        "<{{ m.role }}>{{ m.content }}<|im_end|>{% endif %}{% endfor %}"
    )

    class Tok:
        eos_id = 0

        def encode(self, text):
            return [1] if text.startswith("<|im_end|>") else [2]

        def decode(self, ids, skip_special=True):
            return "" if skip_special else "<|im_end|>"

    with pytest.raises(ChatTemplateError, match="differently"):
        ChatTemplate(last_only).turn_text(
            Tok(),
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
            [{"role": "user", "content": "o"}],
        )


def test_sandbox_blocks_python_internals():
    chat = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        chat.render([{"role": "user", "content": "x"}])
    chat = ChatTemplate("{% set ns = namespace(_x=1) %}{{ ns }}")
    with pytest.raises(jinja2.exceptions.SecurityError, match="underscore"):
        chat.render([{"role": "user", "content": "x"}])


def test_template_files(tmp_path):
    with pytest.raises(ChatTemplateError, match="no chat template"):
        read_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": {"content": "</s>"},
                "chat_template": [
                    {"name": "tool_use", "template": "T"},
                    {"name": "default", "template": "D{{ eos_token }}"},
                ],
            }
        )
    )
    src, specials = read_template(tmp_path)
    assert src == "D{{ eos_token }}" and specials == {"eos_token": "</s>"}
    assert ChatTemplate.from_dir(tmp_path).render([{"role": "user", "content": "x"}]) == "D</s>"
    (tmp_path / "chat_template.jinja").write_text("J")  # the .jinja file comes first
    assert read_template(tmp_path)[0] == "J"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text(
        '{"chat_template": [{"name": "x", "template": "T"}]}'
    )
    with pytest.raises(ChatTemplateError, match="no 'default'"):
        read_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{bad")
    with pytest.raises(ChatTemplateError, match="tokenizer_config.json: invalid JSON"):
        read_template(tmp_path)


def _chat_config(model_dir, **task):
    from jaxrl_frontier.run.config import base_config

    c = base_config()
    c.tokenizer.update(kind="hf", path=str(model_dir))
    c.task.update(chat_template=True, **task)
    c.data.max_prompt_len = 128
    return c


def test_task_chat_template_key_formats_prompts_and_stops(model_dir, hf_tok):
    from jaxrl_frontier.data.tasks import chat as chat_mod
    from jaxrl_frontier.data.tasks import make_task, task_for

    tok = HFTokenizer(model_dir)
    raw = make_task("arithmetic")
    ex = raw.example("train", 3)
    task = task_for(sections.task_options(_chat_config(model_dir)), tok)
    ids = tok.encode(task.prompt(ex))
    ref = hf_tok.apply_chat_template(
        [{"role": "user", "content": raw.prompt(ex)}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert ids == list(ref)
    assert task.prompt(ex).endswith(f"user\n{raw.prompt(ex)}<|im_end|>\n<|im_start|>assistant\n")
    assert task.reward_names == raw.reward_names  # the rest is the task's
    system = task_for(
        sections.task_options(_chat_config(model_dir, system_prompt="Be brief.")), tok
    ).prompt(ex)
    assert system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    # stops: the EOS, then the turn's end token when the two differ
    c = _chat_config(model_dir)
    eos_other = HFTokenizer(model_dir, eos="<|endoftext|>")
    im_end, eot = tok.encode("<|im_end|>")[0], tok.encode("<|endoftext|>")[0]
    assert chat_mod.stop_ids(sections.task_options(c), eos_other) == (eot, im_end)
    c.task.chat_template = False
    assert chat_mod.stop_ids(sections.task_options(c), eos_other) == (eot,)
    assert task_for(sections.task_options(c), tok).prompt(ex) == raw.prompt(ex)


def test_task_chat_template_without_a_model_directory_names_the_keys():
    from jaxrl_frontier.data.tasks import task_for
    from jaxrl_frontier.models.tokenizer import CharTokenizer
    from jaxrl_frontier.run.config import base_config

    c = base_config()
    c.task.chat_template = True
    with pytest.raises(ChatTemplateError, match="task.chat_template.*tokenizer.path"):
        task_for(sections.task_options(c), CharTokenizer())


def test_episode_in_the_chat_template_equals_apply_chat_template(model_dir, hf_tok):
    """An environment episode with task.chat_template: the first prompt, then each sampled
    turn (its stop token included) and the observation after it, give exactly the ids of
    transformers' apply_chat_template on the conversation (user observations, assistant
    actions) with the generation prompt."""
    from jaxrl_frontier.data.tasks import task_for
    from jaxrl_frontier.rl.produce.agent import stop_ids
    from jaxrl_frontier.run.config import base_config

    c = _chat_config(model_dir)
    c.env.update(name="scripted", observation_template="see: {observation}")
    c.env.kwargs = dict(rewards=[0.0, 0.0, 1.0], observations=["two", "three", "end"])
    c.data.max_prompt_len = 128
    tok = HFTokenizer(model_dir)
    task = task_for(sections.task_options(c), tok)
    first = task.env.reset(5)
    ids = tok.encode(task.prompt({"seed": 5}))
    messages = [{"role": "user", "content": f"see: {first}"}]
    im_end = tok.encode("<|im_end|>")[0]
    assert im_end in stop_ids(tok, (), task)
    for action, obs in (("go left", "two"), ("go right", "three")):
        ids += tok.encode(action) + [im_end]  # the sampled turn ends at its stop token
        ids += tok.encode(task.observation_text(obs))
        messages += [
            {"role": "assistant", "content": action},
            {"role": "user", "content": f"see: {obs}"},
        ]
    ref = hf_tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids == list(ref)
    assert base_config().task.chat_template is False  # raw text unless asked
