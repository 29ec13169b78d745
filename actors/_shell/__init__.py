"""_shell"""
