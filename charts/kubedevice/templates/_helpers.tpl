{{- define "kubedevice.fullname" -}}
{{- printf "%s" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubedevice.labels" -}}
app.kubernetes.io/name: kubedevice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kubedevice.selectorLabels" -}}
app.kubernetes.io/name: kubedevice
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
