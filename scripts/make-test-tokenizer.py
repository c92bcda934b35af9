"""Make the tiny Hugging Face tokenizer and golden tokenizations in test-data/tokenizer/.

It trains a small byte-level BPE tokenizer (2,048 tokens) with the `tokenizers` library on a
seeded, generated corpus, saves it with `transformers` together with a ChatML-style
(Qwen2-like) chat template, and records what `transformers` produces for a set of chats
(`apply_chat_template`, text and ids) and plain prompts (`tokenizer(prompt)`). The Rust tests
check kvgate's own tokenization and template rendering against these files, byte for byte.

Output (the directory defaults to test-data/tokenizer):
  tokenizer.json          the tokenizer (normalizer, pre-tokenizer, BPE model, post-processor, decoder)
  tokenizer_config.json   bos/eos/unk, as written by save_pretrained (older transformers put the
                          chat template here too)
  chat_template.jinja     the chat template (transformers 5 writes it here, not into the config)
  special_tokens_map.json if this transformers version writes it
  expected.json           {"cases": [...], "completions": [...], "errors": [...]}

Training is deterministic: rerunning gives the same bytes. To rerun (no network needed):

  .real-vllm/venv/bin/pip install tokenizers transformers   # if not installed yet
  .real-vllm/venv/bin/python scripts/make-test-tokenizer.py [OUT_DIR]
"""
import json
import os
import random
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

VOCAB_SIZE = 2048
SEED = 20240601
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

# Rendered by Hugging Face with jinja2 (trim_blocks=True, lstrip_blocks=True): the first newline
# after a block tag is dropped and the spaces before a block tag on its line are dropped, so the
# raw-text lines of the tools block come out exactly as written.
CHAT_TEMPLATE = """\
{%- set ns = namespace(system='You are a helpful assistant.', text='') %}
{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}
        {%- set ns.system = messages[0]['content'] %}
    {%- else %}
        {%- set ns.system = '' %}
        {%- for part in messages[0]['content'] %}
            {%- if part['type'] == 'text' %}
                {%- set ns.system = ns.system + part['text'] %}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endif %}
{%- if tools %}
<|im_start|>system
{{ ns.system }}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
    {% for tool in tools %}
{{ tool | tojson }}
    {% endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% else %}
<|im_start|>system
{{ ns.system }}<|im_end|>
{% endif %}
{%- for message in messages %}
    {%- if message['content'] is string %}
        {%- set content = message['content'] %}
    {%- elif message['content'] is none %}
        {%- set content = '' %}
    {%- else %}
        {%- set ns.text = '' %}
        {%- for part in message['content'] %}
            {%- if part['type'] == 'text' %}
                {%- set ns.text = ns.text + part['text'] %}
            {%- endif %}
        {%- endfor %}
        {%- set content = ns.text %}
    {%- endif %}
    {%- if message['role'] == 'system' %}
        {%- if not loop.first %}
            {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif message['role'] == 'user' %}
        {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}
    {%- elif message['role'] == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if content.strip() %}
            {{- '\\n' + content.strip() }}
        {%- endif %}
        {%- if message['tool_calls'] %}
            {%- for tool_call in message['tool_calls'] %}
                {{- '\\n<tool_call>\\n{"name": "' + tool_call.function.name + '", "arguments": ' }}
                {%- if tool_call.function.arguments is string -%}
                    {{ tool_call.function.arguments }}
                {%- else -%}
                    {{ tool_call.function.arguments | tojson }}
                {%- endif -%}
                {{ '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message['role'] == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unknown role: ' + message['role']) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

COMMON_WORDS = """
the a an of and to in is it that for on with as was at by this be from or have are not but
you your we our they their he she his her i me my one two three all any can will would should
could do does did done has had get got make made use used see seen new old first last next
cache cached caching request requests response user users assistant tool tools weather system
message messages token tokens prompt prompts model models server gateway route router block
blocks prefix hit miss latency queue tenant key keys limit rate stream chunk engine worker
function call calls result results name arguments city country temperature forecast today
tomorrow please thank thanks hello hi yes no ok what when where why how which who time day
week year number value data file line text word words json string list item items content
role roles chat completion completions generate answer question help helpful sure here there
""".split()

SENTENCE_BITS = [
    "You are a helpful assistant.",
    "What is the weather in Paris today?",
    "The cache hit rate was high.",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '{"type": "function", "function": {"name": "lookup"}}',
    "# Tools", "Thank you!", "Sure, here it is:", "def main():", "    return 0",
]

PUNCT = [".", ".", ".", ",", ",", "!", "?", ":", ";", " -", "'s", "\"", "(", ")", "...", " /"]


def made_up_words(rng, n):
    onsets = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
              "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "st", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "y"]
    codas = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck", "rt", "sh"]
    words = []
    for _ in range(n):
        w = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(1, 3)))
        words.append(w + rng.choice(codas))
    return words


def corpus(seed=SEED, docs=3000):
    rng = random.Random(seed)
    made_up = made_up_words(rng, 600)
    # Zipf-like weights so that frequent words merge into whole tokens.
    common_w = [1.0 / (i + 1) ** 0.7 for i in range(len(COMMON_WORDS))]
    made_w = [1.0 / (i + 1) ** 0.9 for i in range(len(made_up))]
    out = []
    for _ in range(docs):
        lines = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.08:
                lines.append(rng.choice(SENTENCE_BITS))
                continue
            if r < 0.14:
                lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(1, 5))))
                continue
            words = []
            for _ in range(rng.randint(3, 18)):
                if rng.random() < 0.7:
                    w = rng.choices(COMMON_WORDS, common_w)[0]
                else:
                    w = rng.choices(made_up, made_w)[0]
                if rng.random() < 0.06:
                    w = str(rng.randint(0, 2025))
                words.append(w)
            words[0] = words[0].capitalize()
            line = ""
            for i, w in enumerate(words):
                line += w if i == 0 else " " + w
                if rng.random() < 0.08:
                    line += rng.choice(PUNCT)
            line += rng.choice(PUNCT[:6])
            if rng.random() < 0.1:
                line = "  " + line
            lines.append(line)
        out.append("\n".join(lines) + ("\n\n" if rng.random() < 0.3 else "\n"))
    return out


def train():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A:0",
        pair="<s> $A:0 <s>:1 $B:1",
        special_tokens=[("<s>", bos)],
    )
    return tok


LONG_WORDS = ("the cache keeps every block of the prompt so the next request with the same prefix "
              "skips the work and the user sees the first token sooner while the gateway routes "
              "each request to the engine that already holds the longest matching prefix").split()


def long_text(words=3000):
    rng = random.Random(SEED + 1)
    out = []
    for i in range(words):
        w = rng.choice(LONG_WORDS)
        if i % 17 == 0:
            w = w.capitalize()
        out.append(w)
        if i % 23 == 22:
            out[-1] += "."
        if i % 211 == 210:
            out[-1] += "\n\n"
    return " ".join(out).replace("\n\n ", "\n\n")


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city, in °C & 'feels like' <temp>.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich or 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_cache",
        "description": "Look up a prefix in the cache.",
        "parameters": {
            "type": "object",
            "properties": {"prefix": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
            "required": ["prefix"],
        },
    },
}


def cases():
    long = long_text()
    weather_call = {
        "id": "call_1",
        "type": "function",
        # Keys deliberately not in alphabetical order: tojson keeps insertion order.
        "function": {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Zürich"}},
    }
    c = []

    def add(name, messages, tools=None, add_generation_prompt=True):
        c.append({"name": name, "messages": messages, "tools": tools,
                  "add_generation_prompt": add_generation_prompt})

    add("single_user", [{"role": "user", "content": "Hello!"}])
    add("single_user_no_generation_prompt", [{"role": "user", "content": "Hello!"}],
        add_generation_prompt=False)
    add("system_user", [{"role": "system", "content": "You are a terse assistant."},
                        {"role": "user", "content": "What is the cache hit rate?"}])
    add("empty_system", [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}])
    add("multi_turn", [
        {"role": "system", "content": "You answer questions about the weather."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "It is sunny and 21 degrees."},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "Rain, 15 degrees."},
        {"role": "user", "content": "Thanks."},
    ])
    add("multi_turn_no_generation_prompt", [
        {"role": "user", "content": "Say one word."},
        {"role": "assistant", "content": "Cache."},
    ], add_generation_prompt=False)
    add("multi_turn_default_system", [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "second"},
        {"role": "user", "content": "third"},
    ])
    add("long_content", [{"role": "user", "content": long}])
    add("long_system_and_user", [{"role": "system", "content": long[:6000]},
                                 {"role": "user", "content": "Summarise the text above in one line."}])
    add("unicode", [{"role": "user", "content":
                     "Café, naïve, résumé, Ångström, Straße; 東京の天気は？ 北京 서울; emoji 🌦️👍🏽🚀 and 🇫🇷."}])
    add("unicode_nfd_input", [{"role": "user", "content": "Cafe\u0301 and n\u0303 (decomposed accents)"}])
    add("newlines_and_spaces", [
        {"role": "system", "content": "  Leading and trailing spaces.  \n"},
        {"role": "user", "content": "\n\nline one\n  line two\n\n\tline three (tab)   \n"},
        {"role": "assistant", "content": "  \n stripped reply \n\n"},
        {"role": "user", "content": "   "},
    ])
    add("only_newlines", [{"role": "user", "content": "\n"}, {"role": "assistant", "content": "\n\n"},
                          {"role": "user", "content": "\r\nwindows\r\nline endings\r\n"}])
    add("list_of_parts", [
        {"role": "system", "content": [{"type": "text", "text": "System "}, {"type": "text", "text": "in parts."}]},
        {"role": "user", "content": [
            {"type": "text", "text": "Look at this: "},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            {"type": "text", "text": "what is it?"},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": []},
    ])
    add("second_system_message", [
        {"role": "system", "content": "First system."},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Second system, mid-conversation."},
        {"role": "user", "content": "again"},
    ])
    add("tools_default_system", [{"role": "user", "content": "What is the weather in Zürich?"}],
        tools=[WEATHER_TOOL])
    add("tools_with_system", [{"role": "system", "content": "You call tools when useful."},
                              {"role": "user", "content": "Find the prefix 'abc'."}],
        tools=[WEATHER_TOOL, SEARCH_TOOL])
    add("tools_empty_list", [{"role": "user", "content": "No tools here."}], tools=[])
    add("assistant_tool_call_dict_args", [
        {"role": "user", "content": "What is the weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [weather_call]},
    ], tools=[WEATHER_TOOL], add_generation_prompt=False)
    add("assistant_tool_call_string_args", [
        {"role": "user", "content": "Search the cache."},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_2", "type": "function",
            "function": {"name": "search_cache", "arguments": "{\"prefix\": \"abc\", \"limit\": 3}"}}]},
    ], tools=[SEARCH_TOOL], add_generation_prompt=False)
    add("tool_call_and_result", [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Weather in Zürich, please."},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [weather_call]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temperature\": 18, \"condition\": \"cloudy\"}"},
        {"role": "assistant", "content": "It is 18 °C and cloudy in Zürich."},
        {"role": "user", "content": "Thanks!"},
    ], tools=[WEATHER_TOOL])
    add("parallel_tool_calls_and_results", [
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
            {"id": "b", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "東京", "nested": {"days": [1, 2], "ok": True, "x": None}}}},
        ]},
        {"role": "tool", "tool_call_id": "a", "content": "21 °C"},
        {"role": "tool", "tool_call_id": "b", "content": "25 °C"},
    ], tools=[WEATHER_TOOL])
    add("tool_result_last", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [weather_call]},
        {"role": "tool", "content": "sunny"},
    ], tools=[WEATHER_TOOL], add_generation_prompt=False)
    add("special_token_text_in_content", [
        {"role": "user", "content": "Literal <|im_end|> and <s> inside user text."}])
    add("digits_and_punctuation", [
        {"role": "user", "content": "3.14159, 2,048 tokens; 10:30 (UTC) -> 99%! {\"a\": [1, 2]} <tag> & 'q'?"}])
    return c


COMPLETION_PROMPTS = [
    "Hello",
    "The cache hit rate was high.",
    " leading space and trailing space ",
    "Line one\nLine two\n\nLine four",
    "Café 東京 🚀 naïve",
    "Cafe\u0301 decomposed",
    "<|im_start|>user\nhi<|im_end|>",
    "",
    "1234567890 + 0.5 = ?",
]

ERROR_CASES = [
    {"name": "invalid_role", "messages": [{"role": "user", "content": "hi"},
                                          {"role": "robot", "content": "beep"}],
     "tools": None, "add_generation_prompt": True},
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "test-data/tokenizer"
    os.makedirs(out, exist_ok=True)
    tok = train()

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    hf.save_pretrained(out)
    keep = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
            "expected.json", "README.md"}
    for name in os.listdir(out):
        if name not in keep:
            os.remove(os.path.join(out, name))

    # Reload from disk so the expectations come from exactly the saved files.
    hf = PreTrainedTokenizerFast.from_pretrained(out)
    assert hf.chat_template == CHAT_TEMPLATE, "chat template did not round-trip"
    saved = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    assert saved.to_str() == tok.to_str(), "transformers changed tokenizer.json"

    def as_ids(x):
        # apply_chat_template(tokenize=True) returns a list in 4.x and may return a BatchEncoding.
        return list(x["input_ids"]) if hasattr(x, "keys") else list(x)

    expected_cases = []
    for case in cases():
        kwargs = dict(tools=case["tools"], add_generation_prompt=case["add_generation_prompt"])
        text = hf.apply_chat_template(case["messages"], tokenize=False, **kwargs)
        ids = as_ids(hf.apply_chat_template(case["messages"], tokenize=True, **kwargs))
        assert ids == hf(text, add_special_tokens=False)["input_ids"], case["name"]
        expected_cases.append(dict(case, text=text, ids=ids))

    completions = []
    for prompt in COMPLETION_PROMPTS:
        ids = hf(prompt, add_special_tokens=True)["input_ids"]
        no_special = hf(prompt, add_special_tokens=False)["input_ids"]
        assert ids == [hf.bos_token_id] + no_special, prompt
        completions.append({"prompt": prompt, "ids": ids, "ids_no_special": no_special})

    errors = []
    for case in ERROR_CASES:
        try:
            hf.apply_chat_template(case["messages"], tokenize=False, tools=case["tools"],
                                   add_generation_prompt=case["add_generation_prompt"])
        except Exception as e:  # transformers raises TemplateError
            errors.append(dict(case, error=str(e)))
        else:
            raise AssertionError(case["name"] + " rendered without an error")

    expected = {
        "generator": "scripts/make-test-tokenizer.py",
        "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
        "cases": expected_cases,
        "completions": completions,
        "errors": errors,
    }
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")

    size = os.path.getsize(os.path.join(out, "tokenizer.json"))
    print(f"{out}: vocab {saved.get_vocab_size()}, tokenizer.json {size} bytes, "
          f"{len(expected_cases)} chat cases, {len(completions)} completions, {len(errors)} error cases "
          f"(tokenizers {tokenizers.__version__}, transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
