"""Compatibility shim: SageMaker HyperPod's import path, served by hyperpodrun.

Training code written for HyperPod elastic training does

    from hyperpod_elastic_agent.elastic_event_handler import elastic_event_detected

and runs unchanged under hyperpodrun. Only that module is provided; this is
not AWS's hyperpod-elastic-agent package (do not install both).
"""
