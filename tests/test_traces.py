"""Users' traces: read sorted with their lengths, headers as spreadsheets write them, and every
bad row refused in one line naming it, as soon as it is read."""

import tracemalloc

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec import traces


def test_a_trace_is_read_sorted_with_its_lengths_and_says_so(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,100,20\n0.1,7,3\n\n0.2,9,2\n"
                    "0.7,8,2\n")
    trace = traces.load_trace(path)
    reqs = trace.requests(vocab=50)
    assert [(r.rid, r.arrival, r.prompt_len, r.output_len) for r in reqs] == [
        (1, 0.1, 7, 3), (2, 0.2, 9, 2), (0, 0.5, 100, 20), (3, 0.7, 8, 2)]
    assert trace.notes == (f"trace {path}: 2 row(s) arrive before a row above them (the first "
                           f"at line 3); served in arrival order",)
    assert traces.load_trace(tmp_path / "trace.csv").longest == 120
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.1,7,3\n0.1,5,2\n")
    in_order = traces.load_trace(path)
    assert in_order.notes == () and in_order.rid.tolist() == [0, 1]  # ties keep the file's order


@pytest.mark.parametrize("header,sep", [
    ("\ufeffarrival_s,prompt_tokens,output_tokens", ","),  # a byte-order mark
    (" arrival_s , prompt_tokens ,output_tokens ", ","),
    ("arrival_s;prompt_tokens;output_tokens", ";"),
    ("arrival_s\tprompt_tokens\toutput_tokens", "\t"),
    ("model,output_tokens,arrival_s,prompt_tokens", ","),  # other columns, any order
])
def test_trace_headers_as_spreadsheets_write_them(tmp_path, header, sep):
    names = [n.strip().lstrip("\ufeff") for n in header.split(sep)]
    row = {"arrival_s": "0.25", "prompt_tokens": " 12", "output_tokens": "3 ", "model": "x"}
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + sep.join(row[n] for n in names) + "\n", encoding="utf-8")
    (r,) = traces.load_trace(path).requests(vocab=50)
    assert (r.arrival, r.prompt_len, r.output_len) == (0.25, 12, 3)


@pytest.mark.parametrize("text,message", [
    ("", "has no requests"),
    ("\n0,5,5\n", "has no requests .a header row arrival_s,prompt_tokens,output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n\n", "has no requests"),
    ("arrival_s,prompt_tokens\n0,5\n",
     r"lacks the column\(s\) output_tokens; it needs arrival_s, prompt_tokens, output_tokens "
     r"\(found: arrival_s, prompt_tokens\)"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\n", ":2: TIMESTAMP must be a time, got '0'"),
    ("TIMESTAMP,Context,GeneratedTokens\n0,5,5\n",
     r"lacks the column\(s\) arrival_s, prompt_tokens, output_tokens; .* \(found: TIMESTAMP, "
     r"Context, GeneratedTokens\), or to be a published trace: Azure LLM inference"),
    ("arrival_s,prompt_tokens,output_tokens\nsoon,5,5\n",
     ":2: arrival_s must be a number of seconds, got 'soon'"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,5,5\n", ":2: arrival_s must be a finite number >="),
    ("arrival_s,prompt_tokens,output_tokens\nnan,5,5\n", ":2: arrival_s must be a finite number"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,5\ninf,5,5\n", ":3: arrival_s must be a finite"),
    ("arrival_s,prompt_tokens,output_tokens\n0,0,5\n", ":2: token counts must be >= 1, got 0"),
    ("arrival_s,prompt_tokens,output_tokens\n0,-3,5\n", ":2: token counts must be >= 1"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5.5,5\n",
     ":2: prompt_tokens must be a whole number of tokens >= 1, got '5.5'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,nan\n", ":2: output_tokens must be a whole"),
    ("arrival_s,prompt_tokens,output_tokens\n0,inf,5\n", ":2: prompt_tokens must be a whole"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5\n",
     ":2: 2 field.s.; the header puts the columns read in the first 3"),
    ("arrival_s,prompt_tokens,output_tokens\n1e300,5,5\n",
     ":2: arrival_s 1e\\+300: arrivals must come within 1e\\+08 s .~3 years. of the start"),
])
def test_bad_traces(tmp_path, text, message):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(PdmuxError, match=message):
        traces.load_trace(path)
    with pytest.raises(PdmuxError, match="cannot read trace"):
        traces.load_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize("prompt", ["1000000000", "10000000000", "1e10", "1e20",
                                    "100000000000000000000"])
def test_huge_prompts_are_left_out_or_refused_at_their_row_at_once(tmp_path, prompt):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.5," + prompt + ",10\n")
    tracemalloc.start()
    if int(float(prompt)) > traces.MAX_TRACE_TOKENS:  # more than a count holds: a broken row
        for limit in ((40960, "ctx"), ()):
            with pytest.raises(PdmuxError, match=":3: .* at most 2,147,483,647 .the most this"):
                traces.load_trace(path, *limit)
    else:  # more than the model holds: left out, as a server refuses it, and counted
        trace = traces.load_trace(path, 40960, "ctx")
        assert trace.prompt.tolist() == [100]
        assert trace.notes == (f"trace {path}: 1 row(s) of more than 40,960 prompt and output "
                               f"tokens (ctx) left out",)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**20  # read as a count: no prompt's ids drawn, nothing of its size allocated


# --- published formats, as their files begin -----------------------------------------------

def test_an_azure_trace_reads_its_wall_clock_from_the_first_arrival(tmp_path):
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,109\n"
                    "2023-11-16 18:15:50.9951690,879,0\n"  # no output: a failed request
                    "2023-11-16 18:16:02.5,1000,7\n")
    trace = traces.load_trace(path)
    assert trace.arrival.tolist() == pytest.approx([0.0, 4.314579, 15.81941])
    assert trace.prompt.tolist() == [374, 396, 1000] and trace.output.tolist() == [44, 109, 7]
    assert trace.line.tolist() == [2, 3, 5] and trace.hash_ids is None
    assert trace.notes == (f"trace {path}: 1 Azure LLM inference row(s) with no output tokens "
                           f"(failed requests) dropped",)


def test_a_burstgpt_trace_keeps_every_model_and_drops_failed_requests(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "45,GPT-4,1087,0,1087,Conversation log\n"
                    "118,GPT-4,417,30,447,API log\n")
    trace = traces.load_trace(path)
    assert trace.arrival.tolist() == [0.0, 113.0] and trace.prompt.tolist() == [472, 417]
    assert "1 BurstGPT row(s) with no output tokens" in trace.notes[0]


def test_a_mooncake_trace_keeps_its_hash_ids_and_reads_ms(tmp_path):
    path = tmp_path / "conversation_trace"  # no suffix: told by its first line
    path.write_text('{"timestamp": 27482, "input_length": 6955, "output_length": 52, '
                    '"hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}\n'
                    '{"timestamp": 0, "input_length": 1024, "output_length": 3, '
                    '"hash_ids": [0, 1]}\n\n'
                    '{"timestamp": 30535, "input_length": 1500, "output_length": 26, '
                    '"hash_ids": [46, 47, 48]}\n'
                    '{"timestamp": 30536, "input_length": 5, "output_length": 2}\n')
    trace = traces.load_trace(path)
    assert trace.arrival.tolist() == [0.0, 27.482, 30.535, 30.536]
    assert trace.hash_ids == ((0, 1), tuple(range(46, 60)), (46, 47, 48), None)
    assert trace.rid.tolist() == [1, 0, 2, 3] and trace.line.tolist() == [2, 1, 4, 5]
    assert "served in arrival order" in trace.notes[0]


@pytest.mark.parametrize("name,text,message", [
    ("m.jsonl", '{"timestamp": 0, "input_length": 5}\n', ":1: lacks output_length"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n[1]\n',
     ":2: a JSON list, not an object"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n{oops\n',
     ":2: not a JSON object"),
    ("m.jsonl", '{"timestamp": "soon", "input_length": 5, "output_length": 2}\n',
     ":1: timestamp must be a number of ms, got 'soon'"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5.5, "output_length": 2}\n',
     ":1: input_length must be a whole number"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1, "a"]}\n',
     ":1: hash_ids must be a list of integers"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 513, "output_length": 2, "hash_ids": [1]}\n',
     ":1: 1 hash_ids for 513 input tokens; one per 512-token block makes 2"),
    ("m.jsonl", '{"timestamp": -5, "input_length": 5, "output_length": 2}\n',
     ":1: timestamp must be a finite number >= 0"),
    ("m.jsonl", "\n\n", "has no requests"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,0,4\n",
     ":2: token counts must be >= 1, got 0 prompt"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.x5,5,4\n",
     ":2: TIMESTAMP must be a time"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,4\n"
              "2030-01-01 00:00:00,5,4\n", r"its arrivals span 1\.93e\+08 s; arrivals must come"),
])
def test_bad_published_traces(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PdmuxError, match=message):
        traces.load_trace(path)


def test_a_window_of_a_trace_replayed_faster(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" +
                    "".join(f"{t},{10 + i},2\n" for i, t in enumerate((0.5, 1, 2, 4, 8))))
    whole = traces.load_trace(path)
    assert whole.replayed() is whole  # the whole trace, as recorded
    w = whole.replayed(1, 3, 2.0)
    assert w.arrival.tolist() == [0.0, 0.5, 1.5] and w.prompt.tolist() == [11, 12, 13]
    assert w.rid.tolist() == [1, 2, 3]
    assert w.notes == (f"trace {path}: rows 1 to 3 of 5 served, arriving 2x as fast as "
                       f"recorded",)
    assert whole.replayed(speed=4.0).arrival.tolist() == [0.125, 0.25, 0.5, 1.0, 2.0]
    assert "(the 9 asked for run past its end)" in whole.replayed(3, 9).notes[0]
    with pytest.raises(PdmuxError, match=r"--trace-start 5: trace .* holds 5 requests \(rows 0 "
                                         r"to 4\)"):
        whole.replayed(5)


def test_a_mooncake_window_keeps_its_hash_ids(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": 600, "output_length": 2, '
                            f'"hash_ids": [{t}, 9]}}\n' for t in (0, 1000, 2000)))
    assert traces.load_trace(path).replayed(1).hash_ids == ((1000, 9), (2000, 9))


# the Splitwise paper's statistics of the two traces (prompt and output tokens: median, mean,
# p90, p99 where published), which the copies in bench/data must give back as read
AZURE_2023 = {"conv": (19_366, (1020, 1155, 2734, 4142), (129, 211, 424)),
              "code": (8_819, (1469, 2048, 5186), (13, 28, 55))}


@pytest.mark.parametrize("name", sorted(AZURE_2023))
def test_the_azure_2023_traces_read_as_published(name):
    import numpy as np

    path = f"bench/data/azure-llm-2023/AzureLLMInferenceTrace_{name}.csv"
    trace = traces.load_trace(path)
    count, prompt, output = AZURE_2023[name]
    assert len(trace.arrival) == count and trace.notes == () and trace.arrival[0] == 0.0
    for column, published in ((trace.prompt, prompt), (trace.output, output)):
        read = (np.median(column), column.mean(), *np.percentile(column, [90, 99]))
        assert read[:len(published)] == pytest.approx(published, rel=1e-3, abs=1)
    assert 3400 < trace.arrival[-1] < 3600  # an hour of arrivals


def test_a_burstgpt_log_keeps_one_models_rows_when_asked(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "45,GPT-4,1087,20,1107,Conversation log\n"
                    "118,GPT-4,417,30,447,API log\n")
    trace = traces.load_trace(path, model="GPT-4")
    assert trace.prompt.tolist() == [1087, 417] and trace.arrival.tolist() == [0.0, 73.0]
    assert trace.notes == (f"trace {path}: 1 row(s) of models other than GPT-4 left out",)
    with pytest.raises(PdmuxError, match=r"has no requests of --trace-model LLaMA \(its 3 rows "
                                         r"are other models'\)"):
        traces.load_trace(path, model="LLaMA")
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,5,4\n")
    with pytest.raises(PdmuxError, match=r"--trace-model GPT-4: trace .* \(Azure LLM inference\) "
                                         r"names no model per row"):
        traces.load_trace(azure, model="GPT-4")
