"""No ``laminar.*`` key is validated and then ignored: every key of ``config/laminar/enabled.yaml`` maps to tests
that show its effect (the behaviour changes with its value), not only that it parses or that a bad value is refused.

A key added to enabled.yaml fails ``test_every_laminar_key_has_a_test_of_its_effect`` until it has a row here. A
key that nothing reads goes in ``UNREAD_KEYS`` with the reason instead, and its comment in enabled.yaml must say
"not read yet". Pure: reads enabled.yaml and the test files' syntax trees; imports no test module.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

REPO = Path(__file__).resolve().parents[2]
ENABLED = REPO / "verl_laminar" / "config" / "laminar" / "enabled.yaml"
UNREAD_MARK = "not read yet"

# key -> pytest node ids (tests/<file>.py::<top-level test function>) of tests that show what the key changes
KEY_EFFECT_TESTS: dict[str, tuple[str, ...]] = {
    "laminar.replicas": (
        # a count the rollout placement does not hold stops the run at start; null or the placement's count pass
        "tests/config/test_key_wiring_on_cpu.py::test_a_replica_count_the_placement_does_not_hold_stops_the_run_at_start",
        # null: derived from the rollout resources (nodes x devices / TP x DP x PP)
        "tests/config/test_laminar_config_on_cpu.py::test_replicas_derived_from_rollout_resources",
    ),
    "laminar.dispatch.group_size_from_rollout_n": (
        # false with rollout.n > 1 stops the run; its only effect (with n = 1 a group is one response either way)
        "tests/config/test_laminar_config_on_cpu.py::test_cross_checks_with_verl_keys",
    ),
    "laminar.dispatch.groups_per_batch": (
        # null: ceil(train_batch_size / replicas); a set value wins
        "tests/trainer/test_laminar_trainer_on_cpu.py::test_groups_per_batch_defaults_to_a_replicas_share_of_a_step",
        # a replica takes that many groups, then refreshes only once all of them finished
        "tests/policy/test_dispatch_on_cpu.py::test_batch_end_then_refresh_then_next_batch",
    ),
    "laminar.cpu_priority": (
        # true renices only on the CPU platform; false never does
        "tests/config/test_key_wiring_on_cpu.py::test_cpu_priority_renices_only_when_on_and_on_the_cpu_platform",
        # and only the rollouts on a machine with a trainer rank
        "tests/config/test_key_wiring_on_cpu.py::test_cpu_priority_lowers_only_rollouts_that_share_a_machine_with_a_trainer_rank",
        # what the renice does: every thread of every process of a replica's tree
        "tests/foundation/test_priority_on_cpu.py::test_every_thread_of_every_process_in_the_tree_is_reniced",
    ),
    "laminar.helpers": (
        # task_runner: verl's storage units and reward workers on the TaskRunner's node, soft; spread: verl's own
        "tests/config/test_task_runner_pin_on_cpu.py::test_the_task_runner_starts_on_the_drivers_node_and_places_verls_helpers_there",
        # on 3 emulated machines: every helper Ray placed is on the TaskRunner's node
        "tests/fleet/test_laminar_on_emulated_cluster_on_cpu.py::test_laminar_trains_across_three_machines_with_deltas_down_the_chain",
    ),
    "laminar.refresh.wait_factor": (
        # the relay wait deadline is the factor times the modelled broadcast time (doubling it doubles the deadline)
        "tests/policy/test_timeouts_on_cpu.py::test_wait_deadline_is_the_factor_times_the_model_above_the_floor",
        # the router's refresh settings come from the typed key
        "tests/policy/test_timeouts_on_cpu.py::test_settings_from_the_typed_config",
    ),
    "laminar.refresh.min_wait_s": (
        # the floor of every deadline, and the deadline before the version's size is known
        "tests/policy/test_timeouts_on_cpu.py::test_the_floor_holds_for_small_versions_and_short_chains",
        "tests/policy/test_timeouts_on_cpu.py::test_unknown_size_gives_the_floor_and_the_retries",
        # a relay that delivers nothing fails the wait after the floor, naming the key
        "tests/rollout/test_router_on_cpu.py::test_a_relay_that_never_progresses_times_out_after_the_retries",
    ),
    "laminar.refresh.retries": (
        # retries=2: three attempts, each retry logged, then the router stops
        "tests/rollout/test_router_on_cpu.py::test_a_relay_that_never_progresses_times_out_after_the_retries",
        "tests/policy/test_timeouts_on_cpu.py::test_settings_from_the_typed_config",
    ),
    "laminar.buffer.max_staleness": (
        # null: long groups are trained far behind; k: verl's lag at training within k, every step trains
        "tests/rollout/test_staleness_bound_on_cpu.py::test_without_the_bound_long_groups_are_trained_far_behind",
        "tests/rollout/test_staleness_bound_on_cpu.py::test_with_the_bound_every_trained_group_is_within_k_and_every_step_trains",
        "tests/policy/test_bound_on_cpu.py::test_simulated_long_tail_run_stays_within_k_without_dropping_or_deadlock",
        "tests/buffer/test_replay_on_cpu.py::test_a_planner_chooses_the_batch_and_hears_of_failed_groups",
        # verl's own threshold set by a user stops the run naming the key's equivalent value
        "tests/trainer/test_laminar_trainer_on_cpu.py::test_verls_staleness_threshold_is_replaced_at_its_default_and_refused_when_set",
        # the whole trainer with k=1: every step within the bound
        "tests/trainer/test_laminar_e2e_on_cpu.py::test_the_staleness_bound_holds_on_every_step_and_drops_nothing",
    ),
    "laminar.repack.enabled": (
        # false: the router gets no repack settings (no repack rounds)
        "tests/trainer/test_laminar_trainer_on_cpu.py::test_repack_is_on_by_default_and_one_key_turns_it_off",
        # true (the default) in the whole trainer: rounds are reported
        "tests/trainer/test_laminar_e2e_on_cpu.py::test_repack_is_on_by_default_and_reports_its_rounds",
    ),
    "laminar.repack.interval_s": (
        # the router's repack driver runs a round every interval_s
        "tests/config/test_key_wiring_on_cpu.py::test_repack_rounds_run_every_interval_s",
    ),
    "laminar.repack.c_max": (
        # a replica above c_max is no repack source
        "tests/config/test_key_wiring_on_cpu.py::test_c_max_and_max_batch_b_decide_which_replicas_are_repack_sources",
        # targets are filled up to c_max of their cache, never beyond
        "tests/policy/test_repack_on_cpu.py::test_best_fit_plans",
    ),
    "laminar.repack.max_batch_b": (
        # a replica running B sequences is no repack source
        "tests/config/test_key_wiring_on_cpu.py::test_c_max_and_max_batch_b_decide_which_replicas_are_repack_sources",
        # a set B pins the router's policy; null takes the measured CPU value
        "tests/trainer/test_laminar_trainer_on_cpu.py::test_repack_is_on_by_default_and_one_key_turns_it_off",
        # a target never holds more than B sequences
        "tests/policy/test_repack_on_cpu.py::test_best_fit_plans",
    ),
    "laminar.relay.transport": (
        # mooncake places chunks by one-sided writes instead of streaming them over TCP
        "tests/relay/test_transports_on_cpu.py::test_mooncake_chunks_are_placed_not_streamed",
        # tcp needs nothing installed; mooncake fails the start-up check where its engine does not import
        "tests/preflight/test_transport_check_on_cpu.py::test_tcp_passes_without_mooncake",
        "tests/preflight/test_transport_check_on_cpu.py::test_mooncake_missing_on_a_relay_node_fails_with_the_install_line",
        # the whole trainer with transport=mooncake: the relay group starts over Mooncake
        "tests/trainer/test_laminar_e2e_on_cpu.py::test_the_relay_group_started_over_mooncake",
    ),
    "laminar.relay.protocol": (
        # Mooncake's engine starts with the protocol (rdma / tcp)
        "tests/config/test_key_wiring_on_cpu.py::test_protocol_and_device_start_mooncakes_engine_with_them",
    ),
    "laminar.relay.device": (
        # Mooncake's engine starts with the named NICs (null: it picks them)
        "tests/config/test_key_wiring_on_cpu.py::test_protocol_and_device_start_mooncakes_engine_with_them",
        "tests/config/test_key_wiring_on_cpu.py::test_an_rdma_engine_that_finds_no_device_names_the_device_key",
    ),
    "laminar.relay.interface": (
        # a relay binds the named NIC's address instead of its host's
        "tests/relay/test_interface_on_cpu.py::test_relay_binds_the_named_interface_instead_of_its_host",
        "tests/relay/test_interface_on_cpu.py::test_named_interface_resolves_to_its_address",
    ),
    "laminar.relay.chunk_mb": (
        # chunk_mb sets the chunk count of a broadcast; null: the chain cost model
        "tests/relay/test_relay_memory_on_cpu.py::test_chunk_mb_sets_the_chunk_size",
        "tests/relay/test_relay_memory_on_cpu.py::test_relay_applies_the_chunk_policy",
    ),
    "laminar.relay.keep_versions": (
        # 1: the newest is evicted when the next arrives; 2: the previous stays readable until the next staging
        "tests/relay/test_relay_memory_on_cpu.py::test_keep_one_evicts_the_newest_when_the_next_arrives_but_mappings_survive",
        "tests/relay/test_relay_memory_on_cpu.py::test_keep_two_previous_stays_readable_until_the_next_staging",
        # a relay's host memory peak grows with it
        "tests/relay/test_relay_memory_on_cpu.py::test_receiving_store_peak_is_the_formula",
    ),
    "laminar.relay.delta": (
        # the typed key sets each relay's mode: auto sends a sparse change as a delta that every relay rebuilds
        # exactly, off sends it whole; a bare `off` in a YAML file (a boolean to YAML 1.1) means off
        "tests/relay/test_delta_chain_on_cpu.py::test_the_typed_key_sets_what_goes_down_the_chain",
        "tests/relay/test_delta_chain_on_cpu.py::test_deltas_rebuild_every_version_exactly",
        # auto still sends whole versions when the change is dense
        "tests/relay/test_delta_chain_on_cpu.py::test_dense_change_and_off_mode_send_whole_versions",
    ),
    "laminar.relay.link_gbps": (
        # the modelled broadcast time, hence the refresh deadlines, falls with the link speed
        "tests/policy/test_timeouts_on_cpu.py::test_broadcast_time_grows_with_size_and_chain_length_and_falls_with_link_speed",
        "tests/policy/test_timeouts_on_cpu.py::test_settings_from_the_typed_config",
        # faster links: fewer, larger broadcast chunks
        "tests/relay/test_relay_memory_on_cpu.py::test_cost_model_chunk_count",
    ),
    "laminar.pool.enabled": (
        # with the pool a dead replica's request continues from its streamed tokens; without, from the prompt
        "tests/rollout/test_pool_streaming_on_cpu.py::test_a_dead_replicas_request_continues_from_its_streamed_tokens",
        # false: no pool actor and no hang watch under the trainer
        "tests/config/test_key_wiring_on_cpu.py::test_without_the_pool_no_pool_actor_and_no_hang_watch",
        # a garbage fault needs the pool
        "tests/trainer/test_fault_injector_on_cpu.py::test_a_garbage_fault_corrupts_the_server_and_needs_the_pool",
    ),
    "laminar.pool.flush_tokens": (
        # a flush is due after flush_tokens tokens
        "tests/pool/test_partial_pool_on_cpu.py::test_chunk_policy",
        # flush_tokens=8 in the whole trainer: a moved request continues from at least one chunk of 8 tokens
        "tests/trainer/test_laminar_failover_e2e_on_cpu.py::test_the_run_trains_every_step_after_a_replica_dies",
    ),
    "laminar.pool.flush_interval_s": (
        # ...or after flush_interval_s seconds, whichever comes first
        "tests/pool/test_partial_pool_on_cpu.py::test_chunk_policy",
    ),
    "laminar.pool.batch_tick_s": (
        # one apply_many a tick carries every request's chunks; null: one append a chunk
        "tests/rollout/test_pool_streaming_on_cpu.py::"
        "test_a_servers_requests_share_one_pool_call_a_tick_unless_batching_is_off",
    ),
    "laminar.pool.shards": (
        # null: derived from the rollout's GPUs and max_num_seqs; given: that many actors, each owning whole groups
        "tests/pool/test_pool_shards_on_cpu.py::test_the_shard_count_follows_the_running_sequences",
        "tests/pool/test_pool_shards_actor_on_cpu.py::test_two_shards_route_by_group_and_restart_on_their_own",
    ),
    "laminar.pool.log_dir": (
        # the pool's log goes there; null: the node's temp dir, one folder per run
        "tests/pool/test_pool_log_dir_on_cpu.py::test_the_pool_log_goes_to_log_dir_or_to_the_nodes_temp_dir",
    ),
    "laminar.heartbeat.interval_s": (
        # a replica silent for 2 x interval_s is suspect
        "tests/policy/test_failover_on_cpu.py::test_health_from_the_age_of_the_last_heartbeat",
        # the hang watch looks every interval_s (and survives a failed look)
        "tests/trainer/test_hang_watch_on_cpu.py::test_the_watch_survives_a_failed_look",
    ),
    "laminar.heartbeat.dead_after_s": (
        # silent for dead_after_s: dead
        "tests/policy/test_failover_on_cpu.py::test_health_from_the_age_of_the_last_heartbeat",
        # busy and streaming nothing for dead_after_s: hung, killed once
        "tests/trainer/test_hang_watch_on_cpu.py::test_the_watch_kills_a_stuck_replica_once_and_leaves_the_streaming_one",
        "tests/trainer/test_hang_watch_on_cpu.py::test_the_rule_needs_both_a_long_busy_spell_and_a_long_silence",
    ),
    "laminar.replace.enabled": (
        # false: no replacement loop under the trainer, and the router expects none
        "tests/config/test_key_wiring_on_cpu.py::test_replace_enabled_false_starts_no_replacement_loop",
        "tests/rollout/test_replica_failover_on_cpu.py::test_without_a_replacement_coming_a_group_is_lost_not_parked",
        "tests/fleet/test_replacement_on_cpu.py::test_with_every_replica_dead_the_router_waits_for_a_replacement_and_stops_when_none_comes",
    ),
    "laminar.replace.max_replacements": (
        # past the limit a dead replica is refused a replacement, naming the key
        "tests/fleet/test_replacement_on_cpu.py::test_a_failed_start_is_recorded_and_its_rank_never_reused_and_the_limit_holds",
        "tests/fleet/test_replacement_on_cpu.py::test_plan_replaces_each_dead_replica_once_within_the_limit",
    ),
    "laminar.replace.start_timeout_s": (
        # a replacement slower to start than start_timeout_s is given up and released
        "tests/config/test_key_wiring_on_cpu.py::test_a_replacement_that_starts_slower_than_start_timeout_s_is_given_up_and_released",
    ),
    "laminar.fleet.detached": (
        # true: verl's servers become detached actors
        "tests/fleet/test_outlive_on_cpu.py::test_the_server_class_adds_a_detached_lifetime_to_verls_options_call",
        # only a detached fleet's re-issued groups are looked up in the pool
        "tests/policy/test_adopt_on_cpu.py::test_only_the_agent_loops_of_laminar_fleet_adopt_agents_ask_the_pool",
        # the whole trainer, killed and restarted: the fleet generated meanwhile and that work was trained
        "tests/trainer/test_laminar_resume_e2e_on_cpu.py::test_the_rollouts_generated_while_the_trainer_was_down_and_that_work_was_trained",
    ),
    "laminar.fleet.drain_timeout_s": (
        # 0: the old fleet's requests are ended unfinished; longer: they finish within it
        "tests/config/test_key_wiring_on_cpu.py::test_drain_timeout_s_is_how_long_a_restarted_trainer_lets_the_old_fleet_finish",
    ),
    "laminar.fleet.adopt_agents": (
        # only the listed agent loops' groups are adopted from the pool
        "tests/policy/test_adopt_on_cpu.py::test_only_the_agent_loops_of_laminar_fleet_adopt_agents_ask_the_pool",
    ),
    "laminar.fault_injection.kill_replica": (
        # the replica fault of the plan strikes this rank
        "tests/policy/test_fault_plan_on_cpu.py::test_the_single_fault_keys_and_the_schedule_make_one_plan_with_the_trainers_death_last",
        "tests/trainer/test_laminar_failover_e2e_on_cpu.py::test_the_run_trains_every_step_after_a_replica_dies",
    ),
    "laminar.fault_injection.kill_after_step": (
        # ...after this step
        "tests/policy/test_fault_plan_on_cpu.py::test_the_single_fault_keys_and_the_schedule_make_one_plan_with_the_trainers_death_last",
        "tests/trainer/test_laminar_failover_e2e_on_cpu.py::test_the_dead_replica_loads_nothing_after_its_death_and_the_live_one_goes_on",
    ),
    "laminar.fault_injection.replica_fault": (
        # kill / hang / garbage become the plan's fault kind
        "tests/policy/test_fault_plan_on_cpu.py::test_the_single_fault_keys_and_the_schedule_make_one_plan_with_the_trainers_death_last",
        # hang: SIGSTOP; garbage: the server answers out-of-vocabulary ids
        "tests/trainer/test_fault_injector_on_cpu.py::test_a_replica_fault_waits_for_work_and_strikes_the_replica_that_has_it",
        "tests/trainer/test_fault_injector_on_cpu.py::test_a_garbage_fault_corrupts_the_server_and_needs_the_pool",
    ),
    "laminar.fault_injection.kill_pool_after_step": (
        # a pool_kill after this step in the plan; the pool's process is SIGKILLed
        "tests/policy/test_fault_plan_on_cpu.py::test_the_single_fault_keys_and_the_schedule_make_one_plan_with_the_trainers_death_last",
        "tests/trainer/test_fault_injector_on_cpu.py::test_pool_and_trainer_kills_signal_their_processes",
        "tests/trainer/test_laminar_failover_e2e_on_cpu.py::test_a_killed_pool_restarts_from_its_log_and_the_run_goes_on",
    ),
    "laminar.fault_injection.schedule": (
        # each entry STEP:KIND[@REPLICA] becomes a fault of the plan
        "tests/policy/test_fault_plan_on_cpu.py::test_a_schedule_reads_step_kind_and_replica_in_step_order",
        "tests/trainer/test_fault_injector_on_cpu.py::test_a_replica_fault_waits_for_work_and_strikes_the_replica_that_has_it",
    ),
    "laminar.fault_injection.kill_trainer_after_step": (
        # the trainer's own death last in the plan; its process is SIGKILLed
        "tests/policy/test_fault_plan_on_cpu.py::test_the_single_fault_keys_and_the_schedule_make_one_plan_with_the_trainers_death_last",
        "tests/trainer/test_fault_injector_on_cpu.py::test_a_trainer_kill_strikes_before_the_next_publication_even_with_idle_rollouts",
        "tests/trainer/test_laminar_resume_e2e_on_cpu.py::test_the_killed_run_fails_after_its_checkpoint",
    ),
    "laminar.run_until.events": (
        # the run ends at the first step after which the awaited events happened ([]: off)
        "tests/policy/test_until_on_cpu.py::test_the_trainer_glue_ends_early_on_the_event_and_shuts_down_then_raises_on_the_bound",
        "tests/policy/test_until_on_cpu.py::test_the_run_ends_at_the_first_step_after_which_every_event_happened",
    ),
    "laminar.run_until.timeout_s": (
        # past it with an event unseen, the run fails naming the event
        "tests/policy/test_until_on_cpu.py::test_the_trainer_glue_ends_early_on_the_event_and_shuts_down_then_raises_on_the_bound",
        "tests/policy/test_until_on_cpu.py::test_the_time_bound_fails_the_run_naming_the_event_that_did_not_happen",
    ),
    "laminar.run_until.min_steps": (
        # the run trains at least this many steps of its own before it ends on its events
        "tests/policy/test_until_on_cpu.py::test_min_steps_keeps_a_run_going_after_its_events",
        "tests/policy/test_until_on_cpu.py::test_events_seen_before_the_last_fault_wait_for_the_step_after_it",
    ),
    "laminar.metrics.staleness_histogram": (
        # false: no laminar/staleness/hist_<k>; the other staleness metrics stay
        "tests/test_metrics_on_cpu.py::test_staleness_histogram_off_leaves_out_the_bins_and_keeps_the_other_staleness_metrics",
        "tests/test_metrics_on_cpu.py::test_the_trainer_passes_laminar_metrics_staleness_histogram",
    ),
    "laminar.timeline.path": (
        # the file the run writes; null: <trainer.default_local_dir>/laminar_timeline.jsonl
        "tests/test_timeline_on_cpu.py::test_laminar_timeline_path_names_the_file_the_run_writes",
    ),
    "laminar.off_policy.correction": (
        # clipped_token_ratio refuses verl's importance weights / rejection sampling and needs bypass + ppo_clip;
        # verl_rollout_correction runs verl's correction as configured (the correction itself is verl's keys)
        "tests/config/test_laminar_config_on_cpu.py::test_cross_checks_with_verl_keys",
        "tests/config/test_laminar_config_on_cpu.py::test_verl_rollout_correction_with_importance_sampling_is_accepted",
    ),
}

# keys nothing in verl_laminar reads: validated, then without effect; each is marked "not read yet" in enabled.yaml
UNREAD_KEYS: dict[str, str] = {
    "laminar.refresh.policy": "on_batch_end is its only value (others are refused at start-up) and the router always "
                              "refreshes a replica when its own batch ends; nothing chooses between policies",
}


def _leaves(node: DictConfig, prefix: str) -> list[str]:
    out = []
    for key in node:
        child = node[key]
        path = f"{prefix}.{key}"
        out.extend(_leaves(child, path) if isinstance(child, DictConfig) else [path])
    return out


@lru_cache(maxsize=1)
def laminar_keys() -> tuple[str, ...]:
    return tuple(_leaves(OmegaConf.load(ENABLED).laminar, "laminar"))


def yaml_comments() -> dict[str, str]:
    """Dotted key -> the comment lines right above it in enabled.yaml (joined)."""
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    out = {}
    for line in ENABLED.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"^(\s*)([A-Za-z_]\w*):", line)
        if m:
            indent = len(m.group(1))
            stack = [(i, k) for i, k in stack if i < indent] + [(indent, m.group(2))]
            out[".".join(k for _, k in stack)] = " ".join(comment)
        comment = []
    return out


def test_the_walk_finds_the_laminar_block():
    keys = laminar_keys()
    assert len(keys) >= 40 and all(k.startswith("laminar.") for k in keys)
    assert "laminar.buffer.max_staleness" in keys and "laminar.replicas" in keys
    assert "laminar.fleet.adopt_agents" in keys  # a list value is one key, not one per item


def test_every_laminar_key_has_a_test_of_its_effect():
    keys = set(laminar_keys())
    missing = sorted(keys - set(KEY_EFFECT_TESTS) - set(UNREAD_KEYS))
    gone = sorted((set(KEY_EFFECT_TESTS) | set(UNREAD_KEYS)) - keys)
    both = sorted(set(KEY_EFFECT_TESTS) & set(UNREAD_KEYS))
    assert not missing, (f"keys of enabled.yaml without a test of their effect: {missing}; add each to "
                         "KEY_EFFECT_TESTS with the tests that show what its value changes (or, if nothing reads "
                         "it, to UNREAD_KEYS and mark it 'not read yet' in enabled.yaml)")
    assert not gone, f"keys no longer in enabled.yaml: {gone}; remove them from this table"
    assert not both, f"keys both tested and listed as unread: {both}"
    assert all(KEY_EFFECT_TESTS[k] for k in KEY_EFFECT_TESTS), "every row names at least one test"


def test_unread_keys_say_so_in_enabled_yaml():
    comments = yaml_comments()
    assert set(laminar_keys()) <= set(comments)  # the line walk sees every key the YAML load does
    unmarked = sorted(k for k in UNREAD_KEYS if UNREAD_MARK not in comments[k].lower())
    assert not unmarked, f"keys nothing reads must say '{UNREAD_MARK}' in their enabled.yaml comment: {unmarked}"
    claimed = sorted(k for k in KEY_EFFECT_TESTS if UNREAD_MARK in comments.get(k, "").lower())
    assert not claimed, f"keys marked '{UNREAD_MARK}' in enabled.yaml but listed as tested: {claimed}"


@lru_cache(maxsize=None)
def _test_functions(path: str) -> frozenset[str]:
    tree = ast.parse((REPO / path).read_text(), path)
    return frozenset(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def test_every_referenced_test_exists():
    problems = []
    for key, node_ids in KEY_EFFECT_TESTS.items():
        for node_id in node_ids:
            path, sep, name = node_id.partition("::")
            if not sep or "::" in name or not path.startswith("tests/") or not path.endswith(".py"):
                problems.append(f"{key}: {node_id!r} is not tests/<file>.py::<test function>")
            elif not (REPO / path).is_file():
                problems.append(f"{key}: {path} does not exist")
            elif not name.startswith("test_") or name not in _test_functions(path):
                problems.append(f"{key}: {path} has no top-level test function {name}")
    assert not problems, "\n".join(problems)
