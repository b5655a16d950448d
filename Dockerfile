# A raftsched node in a container. Build: `docker build -t raftsched .`
# Run (one node of cluster.toml, whose addresses must be reachable from the other nodes):
#   docker run -e RAFTSCHED_SECRET -v $PWD/cluster.toml:/etc/raftsched/cluster.toml:ro \
#     -v raftsched-n1:/var/lib/raftsched -p 7001:7001 -p 7101:7101 raftsched \
#     node --config /etc/raftsched/cluster.toml --id n1
FROM python:3.11-slim
WORKDIR /opt/raftsched
COPY . .
# The install step is the README's own command ("On a new machine"), without the run.
RUN python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e .
RUN useradd --system --home-dir /var/lib/raftsched --create-home raftsched \
    && chmod 0700 /var/lib/raftsched
USER raftsched
WORKDIR /var/lib/raftsched
VOLUME /var/lib/raftsched
EXPOSE 7001 7101 7201
ENTRYPOINT ["/opt/raftsched/.venv/bin/raftsched"]
CMD ["node", "--config", "/etc/raftsched/cluster.toml", "--id", "n1"]
